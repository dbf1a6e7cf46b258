"""In-place weight loading for the CPU engine: named tensors, safetensors dirs, release / reallocate.

Parameters are updated with ``param.copy_(tensor)``, never replaced, so tied weights (``lm_head.weight`` is
``model.embed_tokens.weight`` when ``tie_word_embeddings``) stay tied and the model object never changes.
"""
from __future__ import annotations

import difflib
import os

import torch

from slime_like.backends.cpu_engine.weight_names import resolve
from slime_like.backends.engine_api.protocol import BadRequest


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every id that means end-of-sequence: generation_config, config and tokenizer may each name some."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        v = getattr(src, "eos_token_id", None) if src is not None else None
        if v is not None:
            ids.update([v] if isinstance(v, int) else v)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _params(model) -> dict[str, torch.nn.Parameter]:
    # remove_duplicate=False: a tied lm_head is reachable under both of its names. Persistent buffers are weights
    # too (DeepSeek-V3 / GLM-4.5 routers' e_score_correction_bias, which the trainer may update).
    buffers = {n: b for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] not in _non_persistent(model, n)}
    return {**buffers, **dict(model.named_parameters(remove_duplicate=False))}


def _non_persistent(model, name: str) -> set:
    owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    return owner._non_persistent_buffers_set


@torch.no_grad()
def load_named_tensors(model, named_tensors) -> int:
    """Copy each (hf_name, tensor) into the model. A name is a parameter's, or a checkpoint key transformers' conversion
    mapping turns into one or into a slice of a fused one (per-expert MoE weights: weight_names.py). Unknown names and
    shape mismatches fail with the fix."""
    params = _params(model)
    n = 0
    for name, tensor in named_tensors:
        p = resolve(model, params, name)
        if p is None:
            close = difflib.get_close_matches(name, list(params), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise BadRequest(f"weight {name!r} is not a parameter of this model{hint}")
        if tuple(p.shape) != tuple(tensor.shape):
            raise BadRequest(f"weight {name!r}: shape {tuple(tensor.shape)} does not match the model's {tuple(p.shape)}")
        if not _is_view_of(tensor, p):  # received in place (receive_distributed): nothing to copy
            p.copy_(tensor.to(dtype=p.dtype))
        n += 1
    return n


def _is_view_of(t: torch.Tensor, p: torch.Tensor) -> bool:
    return (t.data_ptr() == p.data_ptr() and t.dtype == p.dtype and t.shape == p.shape
            and t.stride() == p.stride() and t.device == p.device)


def receive_distributed(model, names, dtypes, shapes, load_format, recv) -> list[tuple[str, torch.Tensor]]:
    """Receive one ``/update_weights_from_distributed`` bucket; returns (name, tensor) for load_named_tensors.

    `recv(tensor)` fills a tensor (a broadcast from rank 0), in the order SGLang's sender uses:
    * load_format None / 'direct': one broadcast per tensor. A tensor whose name is a contiguous parameter (or a
      contiguous slice of a fused one, e.g. one expert's gate_proj) of the same dtype and shape is received straight
      into it (no staging tensor, no second copy;
      load_named_tensors then finds it already in place). Anything else (another dtype, an unknown name) lands in
      a new tensor, converted or refused by load_named_tensors after the bucket, so the stream stays in step.
      Like SGLang, a transfer that fails midway leaves the weights partly updated.
    * 'flattened_bucket': one broadcast of all the bucket's bytes, tensors back to back in order (SGLang's
      FlattenedTensorBucket: uint8, byte offsets), then views of it.
    Call it under the engine's model lock: parameters change while it runs.
    """
    from slime_like.backends.engine_api.process_group import torch_dtype

    if not len(names) == len(dtypes) == len(shapes):
        raise BadRequest(f"names/dtypes/shapes lengths differ: {len(names)}/{len(dtypes)}/{len(shapes)}")
    if load_format not in (None, "direct", "flattened_bucket"):
        raise BadRequest(f"load_format {load_format!r} is not supported; use null, 'direct' or 'flattened_bucket'")
    dts = [torch_dtype(d) for d in dtypes]
    if load_format == "flattened_bucket":
        sizes = [numel(shape) * dt.itemsize for dt, shape in zip(dts, shapes)]
        flat = torch.empty(sum(sizes), dtype=torch.uint8)
        recv(flat)
        out, start = [], 0
        for name, dt, shape, size in zip(names, dts, shapes, sizes):
            piece = flat[start:start + size]
            if start % dt.itemsize:  # view() needs an aligned start (mixed dtypes can misalign)
                piece = piece.clone()
            out.append((name, piece.view(dt).reshape(shape)))
            start += size
        return out
    params = _params(model)
    out = []
    for name, dt, shape in zip(names, dts, shapes):
        try:
            p = resolve(model, params, name)
        except BadRequest:  # refused by load_named_tensors after the bucket, so the stream stays in step
            p = None
        fits = p is not None and p.dtype == dt and tuple(p.shape) == tuple(shape) and p.is_contiguous()
        out.append((name, p if fits else torch.empty(shape, dtype=dt)))
    for _, t in out:
        recv(t)
    return out


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def weight_files(model_path, allowed_dirs: list[str]) -> list[str]:
    """The ``*.safetensors`` files of `model_path`, a literal directory (no wildcard is expanded: a glob let a caller
    load whatever matched) inside one of `allowed_dirs` (the served model's parent and the run's weight-sync dir)."""
    if not isinstance(model_path, str) or not model_path:
        raise BadRequest(f"model_path must be a directory path (a string), got {type(model_path).__name__}")
    if not os.path.isdir(model_path):
        raise BadRequest(f"model_path {model_path!r}: no such directory, so no *.safetensors to load (the path is "
                         "taken literally; wildcards are not expanded)")
    check_inside(model_path, allowed_dirs, "model_path")
    files = sorted(os.path.join(model_path, f) for f in os.listdir(model_path)
                   if f.endswith(".safetensors") and os.path.isfile(os.path.join(model_path, f)))
    if not files:
        raise BadRequest(f"model_path {model_path!r} has no *.safetensors files")
    return files


def check_inside(path: str, allowed_dirs: list[str], what: str) -> None:
    """Refuse a path outside the engine's --weight-dirs (the served model's parent and the run's weight-sync dirs)."""
    if not isinstance(path, str) or not path:
        raise BadRequest(f"{what}: a directory path (a string) is needed, got {type(path).__name__}")
    real = os.path.realpath(path)
    roots = [os.path.realpath(d) for d in allowed_dirs]
    if not any(os.path.commonpath([real, r]) == r for r in roots):
        raise BadRequest(f"{what} {path!r} is outside the directories this engine loads weights from "
                         f"({', '.join(roots)}; the engine's --weight-dirs)")


def load_from_disk(model, model_path: str, allowed_dirs: list[str]) -> int:
    """Load every ``*.safetensors`` file of a Hugging Face model dir into the model in place. File keys go through
    transformers' own conversion mapping for the model (weight_names.py: Qwen2.5-VL's save_pretrained writes
    'model.embed_tokens.*' for the module 'model.language_model.*'; MoE checkpoints hold per-expert weights of the
    fused expert parameters)."""
    from safetensors.torch import load_file

    n = 0
    for f in weight_files(model_path, allowed_dirs):
        n += load_named_tensors(model, load_file(f).items())
    return n


def release(model) -> dict[str, tuple]:
    """Drop every parameter's storage (returns the shapes needed to reallocate)."""
    shapes = {}
    for name, p in model.named_parameters():
        shapes[name] = tuple(p.shape)
        p.data = torch.empty(0, dtype=p.dtype)
    return shapes


def reallocate(model, shapes: dict[str, tuple]) -> None:
    for name, p in model.named_parameters():
        p.data = torch.empty(shapes[name], dtype=p.dtype)


class WeightsChecker:
    """SGLang's /weights_checker (slime's --check-weight-update-equal): `snapshot` copies every parameter, `reset_tensors`
    overwrites them with noise (so a tensor the next weight sync misses cannot pass by luck), `compare` checks the
    parameters equal the snapshot bit for bit and names the ones that do not."""

    def __init__(self):
        self.snapshot: dict[str, torch.Tensor] | None = None

    def handle(self, model, action: str) -> tuple[bool, str]:
        if action == "snapshot":
            self.snapshot = {name: p.detach().clone() for name, p in model.named_parameters()}
            return True, f"Snapshot of {len(self.snapshot)} parameters taken."
        if action == "reset_tensors":
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for _, p in model.named_parameters():
                    noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
                    p.copy_((noise * (p.float().std() if p.numel() > 1 else 1.0)).to(p.dtype))
            return True, "Parameters reset to noise."
        if action == "compare":
            return self._compare(model)
        raise BadRequest(f"/weights_checker action {action!r}; expected 'snapshot', 'reset_tensors' or 'compare'")

    def _compare(self, model) -> tuple[bool, str]:
        if self.snapshot is None:
            raise BadRequest("/weights_checker compare: no snapshot taken (call action 'snapshot' first)")
        current = dict(model.named_parameters())
        bad = []
        for name, ref in self.snapshot.items():
            now = current.get(name)
            if now is None or now.shape != ref.shape or not torch.equal(now.detach(), ref):
                diff = "missing" if now is None or now.shape != ref.shape else \
                    f"max |diff| {float((now.detach().float() - ref.float()).abs().max()):.3g}"
                bad.append(f"{name} ({diff})")
        if bad:
            return False, (f"{len(bad)} of {len(self.snapshot)} parameters differ from the snapshot: "
                           f"{', '.join(bad[:8])}{' ...' if len(bad) > 8 else ''}")
        return True, f"All {len(self.snapshot)} parameters equal the snapshot."

"""In-place weight loading for the CPU engine: named tensors, safetensors dirs, release / reallocate.

Parameters are updated with ``param.copy_(tensor)``, never replaced, so tied weights (``lm_head.weight`` is
``model.embed_tokens.weight`` when ``tie_word_embeddings``) stay tied and the model object never changes.
"""
from __future__ import annotations

import difflib
import glob
import os

import torch

from slime_like.backends.cpu_engine.sampling import BadRequest


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
    # remove_duplicate=False: a tied lm_head is reachable under both of its names.
    return dict(model.named_parameters(remove_duplicate=False))


@torch.no_grad()
def load_named_tensors(model, named_tensors) -> int:
    """Copy each (hf_name, tensor) into the model. Unknown names and shape mismatches fail with the fix."""
    params = _params(model)
    n = 0
    for name, tensor in named_tensors:
        p = params.get(name)
        if p is None:
            close = difflib.get_close_matches(name, list(params), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise BadRequest(f"weight {name!r} is not a parameter of this model{hint}")
        if tuple(p.shape) != tuple(tensor.shape):
            raise BadRequest(f"weight {name!r}: shape {tuple(tensor.shape)} does not match the model's {tuple(p.shape)}")
        p.copy_(tensor.to(dtype=p.dtype))
        n += 1
    return n


def load_from_disk(model, model_path: str) -> int:
    """Load every ``*.safetensors`` file of a Hugging Face model dir into the model in place."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        raise BadRequest(f"model_path {model_path!r} has no *.safetensors files")
    n = 0
    for f in files:
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

"""Runs inside vLLM's worker process (``--worker-extension-cls``): the weight routes SGLang has and vLLM lacks.

vLLM calls these methods through ``/collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``); the adapter
(``slime_like.backends.vllm.adapter``) turns SGLang's weight endpoints into those calls, so the trainer's
senders stay the same for every engine. Each method takes only JSON strings/numbers (``/collective_rpc`` passes
no objects) and returns a small dict.

Why not vLLM's own ``model.load_weights``: on CPU vLLM repacks the linear weights for its GEMM kernels and
leaves ``layer.weight`` empty, so ``load_weights`` fails there. ``model_runner.reload_weights`` re-runs the
load + repack in place and works on CPU and GPU. Two things it does not do, which we do after every update:
* a tied output head (``lm_head.weight is embed_tokens.weight``) is re-packed only for the embedding, so the
  head kept computing with the old weights -> ``_reprocess_tied_modules``;
* the prefix cache still holds KV computed with the old weights -> the adapter calls ``/reset_prefix_cache``.

This module must import only torch, the standard library and our torch-only helpers: it is imported by
vLLM's own interpreter (bench/.venv-vllm), not ours.
"""
from __future__ import annotations

import glob
import math
import os
import threading
import time
from datetime import timedelta

import torch


class SlimeWorkerExtension:
    """Mixed into vLLM's Worker class by vLLM (``self.model_runner`` is the worker's model runner)."""

    # ------------------------------------------------------------------ weights in place
    def _reload(self, named_tensors, fix_tied: bool = True) -> dict:
        t = time.perf_counter()
        names = []

        def tracked():
            for name, tensor in named_tensors:
                names.append(name)
                yield name, tensor

        self.reload_weights(weights_iterator=tracked(), is_checkpoint_format=True)
        fixed = _reprocess_tied_modules(self.model_runner.get_model()) if fix_tied else []
        return {"loaded": len(names), "tied_reprocessed": fixed, "seconds": time.perf_counter() - t}

    def _stage(self, named_tensors, copy: bool) -> dict:
        """Hold one bucket; reload once every weight of the checkpoint has arrived.

        A sync comes in buckets, and vLLM's layer-wise reload processes a fused layer (q/k/v -> qkv_proj,
        gate/up -> gate_up_proj) as soon as a reload ends, loaded or not: a layer split across two buckets would
        be processed half-garbage. So buckets are staged (in this worker's memory) until the sync is complete."""
        expected = _checkpoint_names(self)
        staged = self.__dict__.setdefault("_slime_staged", {})
        for name, tensor in named_tensors:
            if name not in expected["all"]:
                raise ValueError(f"weight {name!r} is not a weight of the served checkpoint "
                                 f"({len(expected['all'])} names, e.g. {sorted(expected['all'])[0]!r})")
            staged[name] = tensor.clone() if copy else tensor
        if not expected["required"] <= set(staged):
            return {"staged": len(staged), "of": len(expected["required"]), "loaded": 0}
        named = list(staged.items())
        staged.clear()
        return self._reload(named)

    def slime_update_from_tensor(self, serialized: list, load_format: str | None = None) -> dict:
        """SGLang's ``serialized_named_tensors``: one shared-memory (CPU) or CUDA IPC (GPU) payload per TP rank."""
        from slime_like.backends.engine_api import tensor_serializer

        payload = tensor_serializer.deserialize(serialized[_tp_rank(self)], _checkpoint_names(self)["payload_bytes"])
        if load_format == "flattened_bucket":
            named = _unflatten(payload)
        elif load_format in (None, "", "direct"):
            named = list(payload)
        else:
            raise ValueError(f"load_format {load_format!r}: the vllm engine takes None or 'flattened_bucket'")
        out = self._stage(named, copy=True)   # copies: the shared-memory mappings are dropped before answering
        del payload, named
        return out

    def slime_update_from_disk(self, model_path: str, fix_tied: bool = True) -> dict:
        """Every *.safetensors of an HF dir (fix_tied=False only shows the stale-head fact in a test)."""
        self.__dict__.pop("_slime_staged", None)
        self.__dict__["_slime_ckpt"] = model_path   # later pushes are checked against this checkpoint's names
        return self._reload(_safetensors(model_path), fix_tied)

    def slime_plain_load_weights(self, model_path: str) -> str:
        """vLLM's plain ``model.load_weights`` (what GPU RL frameworks call) with a checkpoint's tensors; returns
        the error it raised, '' if none. Not used for updates: a test pins that it fails on CPU (vLLM re-packs
        linear weights for its CPU GEMM kernels and leaves the loader's tensors empty), which is why updates go
        through reload_weights. Reload a checkpoint afterwards: a failed load can leave weights half-written."""
        try:
            self.model_runner.get_model().load_weights(_safetensors(model_path))
        except Exception as e:  # noqa: BLE001  (the failure is the result)
            return f"{type(e).__name__}: {e}"[:2000]
        return ""

    # ------------------------------------------------------------------ process group (disaggregated)
    def slime_init_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                         group_name: str, backend: str, join_timeout_s: float) -> dict:
        """Starts joining the group on a thread and returns at once (``slime_group_status`` says when it is done).

        Joining in the RPC itself held vLLM's engine core for up to the 60 s rendezvous timeout: it served no
        request meanwhile, and a timed-out join raised inside the core's RPC (the server once reset every
        connection after it). On a thread the core keeps serving and the error is reported, never raised there."""
        from slime_like.backends.engine_api.process_group import init_custom_process_group

        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("init_weights_update_group: backend 'nccl' needs CUDA; this vLLM runs on CPU: use gloo")
        joins = self.__dict__.setdefault("_slime_joins", {})
        if not joins.get(group_name, {"done": True})["done"]:
            raise ValueError(f"init_weights_update_group: group {group_name!r} is already being joined")
        rank = int(rank_offset) + _tp_rank(self)
        state = joins[group_name] = {"done": False, "error": "", "rank": rank}
        groups = self.__dict__.setdefault("_slime_groups", {})

        def join():
            try:
                groups[group_name] = init_custom_process_group(
                    backend, f"tcp://{master_address}:{int(master_port)}", int(world_size), rank, group_name,
                    timeout=timedelta(seconds=300),
                    rendezvous_timeout=timedelta(seconds=float(join_timeout_s)))
            except Exception as e:  # noqa: BLE001  (reported through slime_group_status)
                state["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            finally:
                state["done"] = True

        threading.Thread(target=join, name=f"slime-join-{group_name}", daemon=True).start()
        return {"rank": rank}

    def slime_group_status(self, group_name: str) -> dict:
        """{"done", "error", "rank"} of the latest join of `group_name` started by slime_init_group."""
        state = self.__dict__.get("_slime_joins", {}).get(group_name)
        if state is None:
            raise ValueError(f"no join of weight-update group {group_name!r} was started")
        return dict(state)

    def slime_update_from_distributed(self, names: list, dtypes: list, shapes: list, group_name: str,
                                      load_format: str | None = None) -> dict:
        from slime_like.backends.engine_api.process_group import torch_dtype

        pg = self.__dict__.get("_slime_groups", {}).get(group_name)
        if pg is None:
            raise ValueError(f"update_weights_from_distributed: no weight-update group {group_name!r}; "
                             "call /init_weights_update_group first")
        device = "cuda" if torch.cuda.is_available() and pg.name() == "nccl" else "cpu"
        dts = [torch_dtype(d) for d in dtypes]
        if load_format == "flattened_bucket":
            flat = torch.empty(sum(_nbytes(s, d) for s, d in zip(shapes, dts)), dtype=torch.uint8, device=device)
            torch.distributed.broadcast(flat, src=0, group=pg)
            return self._stage(_unflatten_raw(flat, names, dts, shapes), copy=False)
        tensors = []
        for name, dt, shape in zip(names, dts, shapes):
            t = torch.empty(shape, dtype=dt, device=device)
            torch.distributed.broadcast(t, src=0, group=pg)
            tensors.append((name, t))
        return self._stage(tensors, copy=False)

    def slime_destroy_group(self, group_name: str) -> dict:
        pg = self.__dict__.get("_slime_groups", {}).pop(group_name, None)
        if pg is not None:
            torch.distributed.destroy_process_group(pg)
        return {"destroyed": pg is not None}

    # ------------------------------------------------------------------ checks
    def slime_weight_checksum(self, name: str) -> list:
        """The first values of one parameter as vLLM holds it (tests compare it with what was sent)."""
        param = dict(self.model_runner.get_model().named_parameters())[name]
        return param.detach().flatten()[:8].float().tolist()


def _safetensors(model_path: str):
    """(name, tensor) of every *.safetensors of an HF dir, one tensor at a time."""
    if not isinstance(model_path, str) or not os.path.isdir(model_path):   # literal: no wildcard is expanded
        raise FileNotFoundError(f"update_weights_from_disk: {model_path!r} is not a directory")
    files = sorted(os.path.join(model_path, f) for f in os.listdir(model_path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"update_weights_from_disk: no *.safetensors in {model_path}")
    from safetensors import safe_open

    def named():
        for path in files:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    yield key, f.get_tensor(key)
    return named()


def _checkpoint_names(worker) -> dict:
    """HF weight names of the served checkpoint: 'all' accepted, 'required' before a staged sync loads."""
    path = worker.__dict__.get("_slime_ckpt") or worker.vllm_config.model_config.model
    cache = worker.__dict__.setdefault("_slime_names", {})
    if path not in cache:
        from safetensors import safe_open

        from slime_like.backends.engine_api import tensor_serializer

        numels = {}
        for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            with safe_open(f, framework="pt") as st:
                numels.update((k, math.prod(st.get_slice(k).get_shape())) for k in st.keys())
        names = set(numels)
        tied = bool(getattr(worker.vllm_config.model_config.hf_config, "tie_word_embeddings", False))
        if tied and "lm_head.weight" not in numels:   # a trainer may send the tied head
            numels["lm_head.weight"] = numels.get("model.embed_tokens.weight", 0)
        cache[path] = {"all": set(numels), "required": names - {"lm_head.weight"} if tied else names,
                       # the payload bound, from the checkpoint: vLLM's own parameters are repacked (on CPU nearly
                       # empty), so they cannot say how big a push may be
                       "payload_bytes": tensor_serializer.model_bytes(numels.values())}
    return cache[path]


def _tp_rank(worker) -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001  (no TP group: a single worker)
        return 0


def _reprocess_tied_modules(model) -> list:
    """Re-run post-load processing for modules whose weight Parameter another module owns (a tied head).

    reload_weights re-packs what it loaded; the head shares the embedding's Parameter, loads nothing itself and
    keeps the kernel-format copy made from the old weights. Processing it again rebuilds that copy."""
    owners: dict = {}
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if isinstance(w, torch.nn.Parameter):
            owners.setdefault(id(w), []).append((name, module))
    fixed = []
    for shared in (v for v in owners.values() if len(v) > 1):
        for name, module in shared:
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
                fixed.append(name)
    return fixed


def _nbytes(shape, dtype) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * torch.empty((), dtype=dtype).element_size()


def _unflatten_raw(flat: torch.Tensor, names, dtypes, shapes) -> list:
    out, off = [], 0
    for name, dt, shape in zip(names, dtypes, shapes):
        n = _nbytes(shape, dt)
        out.append((name, _view(flat[off:off + n], dt, shape)))
        off += n
    return out


def _unflatten(payload) -> list:
    """SGLang's flattened-bucket payload: {'flattened_tensor', 'metadata': [{name, shape, dtype, start_idx, end_idx}]}."""
    flat, meta = payload["flattened_tensor"], payload["metadata"]
    out = []
    for m in meta:
        m = m if isinstance(m, dict) else vars(m)
        out.append((m["name"], _view(flat[m["start_idx"]:m["end_idx"]], m["dtype"], m["shape"])))
    return out


def _view(piece: torch.Tensor, dtype, shape) -> torch.Tensor:
    if piece.storage_offset() % torch.empty((), dtype=dtype).element_size():
        piece = piece.clone()  # view() needs an aligned start (mixed dtypes in one bucket can misalign)
    return piece.view(dtype).reshape([int(s) for s in shape])

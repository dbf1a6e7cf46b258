"""Megatron distributed checkpoints (dist_checkpointing `torch_dist`), published atomically.

Layout (Megatron-LM's):  SAVE/iter_0000007/{*.distcp, common.pt, .metadata, metadata.json}
                         SAVE/latest_checkpointed_iteration.txt   ("7")

A save writes the iteration directory first (dist_checkpointing writes its metadata.json last), then
records every file's size and CRC-32 (training/manifest.py), then publishes the marker with tmp +
os.replace. A crash before the publish leaves the marker on the previous iteration, so resume never picks a
half-written checkpoint; if the marker ever points to an incomplete directory or one whose files no longer
match their record, load falls back to the newest complete, once-published one below it with a warning
naming the bad file (iter dirs get a PUBLISHED file when published; Megatron-LM ignores it and the record).
State: model chunks, optimizer (optional), LR scheduler (optional), RNG (python, numpy, torch, CUDA,
mcore tracker; per rank, restored only when the topology is unchanged), iteration, extra_state.
Loading reads no file of the directory as code (safe_load.py: restricted DCP metadata, weights-only objects).
"""
from __future__ import annotations

import logging
import os
import random
import shutil

import numpy as np
import torch
import torch.distributed as dist

from slime_like.backends.training.publish import PUBLISHED, TRACKER, is_hf_dir, iteration_dir  # noqa: F401
from slime_like.backends.training.publish import check_iteration, disk_space_checked, record_files, release_dir
from slime_like.backends.training.publish import latest_iteration as _latest_iteration
from slime_like.backends.training.publish import publish as _publish

log = logging.getLogger(__name__)


def _rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _topology():
    from megatron.core import parallel_state as ps

    return (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size(),
            ps.get_data_parallel_world_size(with_context_parallel=True))


def _rng_object():
    """This rank's RNG states as a ShardedObject indexed by (pp, tp, dp) rank."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing import ShardedObject
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    state = {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
             "tracker": get_cuda_rng_tracker().get_states()}
    rank = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(),
            ps.get_data_parallel_rank(with_context_parallel=True))
    return ShardedObject("rng_state", state, _topology(), rank, replica_id=0)


def _set_rng(state):
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _model_state(model_chunks):
    from slime_like.backends.megatron.hf_weights import unwrap

    chunks = [unwrap(c) for c in model_chunks]
    if len(chunks) == 1:
        return {"model": chunks[0].sharded_state_dict()}
    return {f"model{i}": c.sharded_state_dict() for i, c in enumerate(chunks)}


def _sharded_state(model_chunks, optimizer, scheduler, is_loading, with_rng=True):
    state = _model_state(model_chunks)
    if optimizer is not None:
        if is_loading:
            _prime_distributed_optimizer(optimizer)
        model_sd = {}
        for v in state.values():
            model_sd.update(v)
        # distributed optimizer: "fully_reshardable" (Adam state in model space, any topology on resume);
        # mcore 0.16's default "fully_sharded_model_space" fails with "flattened_range is not supported"
        state["optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=is_loading, metadata={"distrib_optim_sharding_type": "dp_reshardable"})
    if scheduler is not None:
        state["opt_param_scheduler"] = scheduler.state_dict()
    if with_rng:
        state["rng_state"] = _rng_object()
    return state


def _prime_distributed_optimizer(optimizer):
    """A DistributedOptimizer that never stepped has no Adam state to load into (mcore 0.16 without Apex/TE
    asserts on it in state_dict()); give it mcore's dummy states, which the load then overwrites."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is not None and not inner.state and hasattr(opt, "_init_optimizer_states_with_dummy_values"):
            opt._init_optimizer_states_with_dummy_values()


def _fix_adam_steps(optimizer, loaded_optimizer_state):
    """mcore 0.16's DistributedOptimizer on the torch-Adam path (no Apex/TE, i.e. CPU) keeps the Adam
    `step` in its param groups and restores it wrongly (one tensor shared by all parameters, which torch
    Adam then increments once per parameter; or the pre-load value). Set each parameter's own step
    from the checkpoint's param groups."""
    groups = loaded_optimizer_state.get("optimizer", {}).get("param_groups", []) \
        if isinstance(loaded_optimizer_state, dict) else []
    steps = {g["step"] for g in groups if "step" in g}
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in getattr(getattr(opt, "optimizer", None), "state", {}).values():
            if torch.is_tensor(state.get("step")):
                state["step"] = torch.tensor(float(next(iter(steps)))) if len(steps) == 1 else state["step"].clone()


def save_checkpoint(save_dir: str, iteration: int, model_chunks, optimizer=None, scheduler=None,
                    extra_state: dict | None = None) -> str:
    """Collective: write SAVE/iter_XXXXXXX in torch_dist format, then publish the marker. Returns the dir."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    if not save_dir:
        raise ValueError("save_checkpoint: empty save dir; set --save")
    path = iteration_dir(save_dir, iteration)
    if _rank0():
        os.makedirs(save_dir, exist_ok=True)
        if os.path.exists(path):  # leftovers of an earlier (possibly killed) save of the same iteration
            shutil.rmtree(path)
        os.makedirs(path)
    _barrier()
    state = _sharded_state(model_chunks, optimizer, scheduler, is_loading=False)
    state.update(iteration=iteration, checkpoint_version=3.0, topology=_topology(),
                 has_optimizer=optimizer is not None, extra_state=extra_state or {})
    with disk_space_checked(save_dir, iteration):
        dist_checkpointing.save(state, path, sharded_strategy=get_default_save_sharded_strategy("torch_dist"))
    _barrier()  # every rank's shards are on disk before their record and the marker
    record_files(save_dir, iteration)
    if _rank0():
        _publish(save_dir, iteration)
    _barrier()
    return path


def _is_complete(path: str) -> bool:
    from megatron.core.dist_checkpointing import check_is_distributed_checkpoint

    try:
        return os.path.isdir(path) and check_is_distributed_checkpoint(path)
    except (OSError, ValueError):   # an unreadable metadata.json: not a checkpoint to load
        return False


def latest_iteration(load_dir: str) -> int | None:
    """The published iteration, or the newest complete one below it if that directory is incomplete."""
    return _latest_iteration(load_dir, _is_complete)


def _load_release(load_dir: str, model_chunks, iteration) -> None:
    """Megatron-LM's `release` checkpoint (its marker says release, the weights are in LOAD/release/): model weights
    only, as Megatron-LM loads it (no optimizer, scheduler or RNG state; training starts at iteration 0)."""
    from megatron.core import dist_checkpointing

    from slime_like.backends.megatron import safe_load
    from slime_like.backends.megatron.hf_weights import unwrap

    path = release_dir(load_dir)
    if iteration is not None:
        raise ValueError(f"{load_dir}: a release checkpoint (marker 'release') has no iterations; drop the step "
                         f"(--ckpt-step / --opd-teacher-ckpt-step {iteration})")
    if not _is_complete(path):
        raise FileNotFoundError(f"{load_dir}: {TRACKER} says release but {path} is not a complete torch_dist "
                                "checkpoint (Megatron-LM's legacy torch format is not read: convert it to torch_dist)")
    state = _sharded_state(model_chunks, None, None, is_loading=True, with_rng=False)
    loaded = dist_checkpointing.load(state, path, **safe_load.strategies())
    chunks = [unwrap(c) for c in model_chunks]
    for i, chunk in enumerate(chunks):
        chunk.load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"], strict=True)
    _barrier()


def load_checkpoint(load_dir: str, model_chunks, optimizer=None, scheduler=None, load_optim: bool = True,
                    args=None, iteration: int | None = None) -> int | None:
    """Restore model (+ optimizer, scheduler, RNG when load_optim) from LOAD; return its iteration.

    `iteration` (--ckpt-step) picks a specific complete iteration instead of the published latest.
    An HF directory loads HF weights instead (needs `args`: the model's flags) and returns None, as do a
    directory without a published checkpoint and Megatron-LM's `release` checkpoint (weights only).
    """
    from megatron.core import dist_checkpointing

    from slime_like.backends.megatron import safe_load
    from slime_like.backends.megatron.hf_weights import unwrap

    if is_hf_dir(load_dir):
        from slime_like.backends.megatron import hf_weights, model

        if args is None:
            raise ValueError(f"{load_dir} is an HF directory: load_checkpoint needs the run's args to map its weights")
        hf_weights.load_hf_weights(model_chunks, load_dir, args)
        return None
    if not load_dir or not os.path.isdir(load_dir):
        raise FileNotFoundError(f"--load {load_dir!r}: no such directory")
    if release_dir(load_dir):
        _load_release(load_dir, model_chunks, iteration)
        return None  # weights to start from, as an HF directory: no iteration to resume
    if iteration is None:
        iteration = latest_iteration(load_dir)
        if iteration is None:
            return None
    else:
        check_iteration(load_dir, iteration, _is_complete)
    path = iteration_dir(load_dir, iteration)
    common = safe_load.SafeCommonLoadStrategy().load_common(path)
    if not load_optim:
        optimizer = scheduler = None
    if optimizer is not None and not common.get("has_optimizer", False):
        raise ValueError(f"{path} was saved without optimizer state (--no-save-optim); resume with --no-load-optim")
    same_topology = tuple(common.get("topology", ())) == _topology()
    state = _sharded_state(model_chunks, optimizer, scheduler, is_loading=True,
                           with_rng=load_optim and same_topology)
    loaded = dist_checkpointing.load(state, path, **safe_load.strategies())
    chunks = [unwrap(c) for c in model_chunks]
    for i, chunk in enumerate(chunks):
        chunk.load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"], strict=True)
    if optimizer is not None:
        with torch.no_grad():  # the distributed optimizer copies into views of leaf params
            optimizer.load_state_dict(loaded["optimizer"])
        _fix_adam_steps(optimizer, loaded["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(loaded["opt_param_scheduler"])
    if "rng_state" in loaded:
        _set_rng(loaded["rng_state"])
    elif load_optim:
        log.warning("%s: saved with (pp, tp, dp) = %s, running with %s: RNG state not restored",
                    path, common.get("topology"), _topology())
    _barrier()
    return int(common["iteration"])


"""FSDP trainer checkpoints with torch's distributed checkpoint (DCP), published last.

Layout:  SAVE/iter_0000007/{__<rank>_0.distcp, .metadata}   sharded model (+ optimizer) state, written by DCP
         SAVE/iter_0000007/fsdp_meta.json                    iteration, world size, LoRA config, LR schedule
         SAVE/iter_0000007/rng/rank<r>.json                  each rank's RNG streams
         SAVE/iter_0000007/checkpoint_files.json             every file's size and CRC-32 (training/manifest.py)
         SAVE/latest_checkpointed_iteration.txt              the publish marker (training/publish.py)
A directory counts as complete once DCP's .metadata and fsdp_meta.json (written after every rank's shards
are on disk) exist; the marker moves only after that, so a killed save is never picked up.
DCP reshards on load: a checkpoint written at world size 2 loads at 1 (RNG streams are then not restored,
as in the Megatron backend). With LoRA the model state holds only the trainable (adapter / value head)
tensors; the frozen base comes from --hf-checkpoint. Nothing is read as code: DCP's .metadata through a restricted
unpickler, stored objects weights-only (training/safe_dcp.py), the rest JSON.
"""
from __future__ import annotations

import json
import logging
import os
import random
import shutil

import numpy as np
import torch
import torch.distributed as dist

from slime_like.backends.training.publish import (TRACKER, check_iteration, disk_space_checked, iteration_dir,
                                                  latest_iteration, publish, record_files)
from slime_like.backends.training import safe_dcp

META = "fsdp_meta.json"
log = logging.getLogger(__name__)


def _is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ".metadata")) and os.path.isfile(os.path.join(path, META))


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable as JSON ({type(e).__name__}: {e})") from None


def has_checkpoint(path) -> bool:
    return bool(path) and os.path.isfile(os.path.join(path, TRACKER))


def _rank0() -> bool:
    return dist.get_rank() == 0


def _trainable_only(trainer, model_sd: dict) -> dict:
    if not trainer.lora:
        return model_sd
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    return {k: v for k, v in model_sd.items() if k in trainable}


def _state(trainer, with_optim: bool) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": _trainable_only(trainer, model_sd)}
    if with_optim:
        state["optim"] = optim_sd
    return state


def _rng_state() -> dict:
    version, keys, gauss = random.getstate()
    name, mt, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(keys), gauss], "numpy": [name, mt.tolist(), pos, has_gauss, cached],
            "torch": torch.get_rng_state().tolist(),
            "cuda": torch.cuda.get_rng_state().tolist() if torch.cuda.is_available() else None}


def _set_rng(state: dict):
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    name, mt, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(mt, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8))


def _lora_meta(args) -> dict | None:
    rank = int(args.lora_rank)
    if not rank:
        return None
    return {"rank": rank, "alpha": float(args.lora_alpha), "target_modules": list(args.lora_target_modules)}


def save(trainer, save_dir: str, iteration: int, with_optim: bool = True) -> str:
    """Collective: write SAVE/iter_XXXXXXX with DCP, then the metadata, then publish the marker."""
    import torch.distributed.checkpoint as dcp

    path = iteration_dir(save_dir, iteration)
    if _rank0():
        os.makedirs(save_dir, exist_ok=True)
        if os.path.exists(path):  # leftovers of an earlier (possibly killed) save of the same iteration
            shutil.rmtree(path)
        os.makedirs(os.path.join(path, "rng"))
    dist.barrier()
    with disk_space_checked(save_dir, iteration):
        dcp.save(_state(trainer, with_optim), checkpoint_id=path)
        with open(os.path.join(path, "rng", f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump(_rng_state(), f)
    dist.barrier()  # every rank's shards and RNG are on disk before the metadata and the marker
    if _rank0():
        meta = {"iteration": iteration, "world_size": dist.get_world_size(), "role": trainer.role,
                "has_optimizer": with_optim, "lora": _lora_meta(trainer.args),
                "scheduler": trainer.scheduler.state_dict() if with_optim else None}
        with open(os.path.join(path, META), "w") as f:
            json.dump(meta, f, indent=1)
    dist.barrier()   # the metadata is on disk before the files' record
    record_files(save_dir, iteration)
    if _rank0():
        publish(save_dir, iteration)
    dist.barrier()
    return path


def load(trainer, load_dir: str, load_optim: bool = True, iteration: int | None = None) -> int | None:
    """Restore model (+ optimizer, LR schedule, RNG when load_optim) from the published iteration of LOAD, or
    from `iteration` (--ckpt-step, or the run's resume iteration) when given."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    if iteration is None:
        iteration = latest_iteration(load_dir, _is_complete)
        if iteration is None:
            return None
    else:
        check_iteration(load_dir, iteration, _is_complete)
    path = iteration_dir(load_dir, iteration)
    meta = _read_json(os.path.join(path, META))
    if meta.get("lora") != _lora_meta(trainer.args):
        raise ValueError(f"{path} was saved with LoRA {meta.get('lora')} but this run has {_lora_meta(trainer.args)}; "
                         "use the same --lora-rank / --lora-alpha / --lora-target-modules (or a fresh --save dir)")
    if load_optim and not meta["has_optimizer"]:
        raise ValueError(f"{path} was saved without optimizer state (--no-save-optim); resume with --no-load-optim")
    state = _state(trainer, load_optim)
    safe_dcp.load(state, path)
    options = StateDictOptions(strict=not trainer.lora)  # LoRA checkpoints hold only the trainable tensors
    if load_optim:
        set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=options)
    else:
        set_model_state_dict(trainer.model, state["model"], options=options)
    if load_optim:
        trainer.scheduler.load_state_dict(meta["scheduler"])
        if meta["world_size"] == dist.get_world_size():
            _set_rng(_read_json(os.path.join(path, "rng", f"rank{dist.get_rank()}.json")))
        else:
            log.warning("%s: saved at world size %d, running at %d: RNG state not restored", path,
                        meta["world_size"], dist.get_world_size())
    dist.barrier()
    return int(meta["iteration"])

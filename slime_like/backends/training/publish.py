"""Publish-last checkpoint directories, shared by every trainer backend.

Layout (Megatron-LM's):  SAVE/iter_0000007/...   SAVE/latest_checkpointed_iteration.txt ("7")
A save writes its iteration directory completely, then `publish` marks it PUBLISHED and atomically moves
the marker (tmp + fsync + os.replace). A save killed before the publish stays invisible; if the marker ever
names an incomplete directory, `latest_iteration` falls back to the newest complete, once-published one.
What "complete" means is the backend's (torch_dist metadata, DCP .metadata): it passes `is_complete`. Before the
publish every file's size and CRC-32 is recorded (`record_files`, manifest.py); an iteration whose files no longer
match is unusable like an incomplete one: `latest_iteration` falls back past it with a warning naming the file,
`check_iteration` (an iteration asked for by --ckpt-step) refuses it.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil

from slime_like.backends.training import manifest

TRACKER = "latest_checkpointed_iteration.txt"
PUBLISHED = "PUBLISHED"
# Megatron-LM's marker text for a weights-only checkpoint in LOAD/release/ (its converter writes it; read_metadata
# reads it as iteration 0, and load_checkpoint then loads no optimizer or RNG state)
RELEASE = "release"
log = logging.getLogger(__name__)


def is_hf_dir(path) -> bool:
    """An HF model directory: config.json + safetensors weights, and no iteration marker (not a training
    checkpoint of either backend)."""
    if not path or not os.path.isdir(path) or os.path.exists(os.path.join(path, TRACKER)):
        return False
    files = os.listdir(path)
    return "config.json" in files and any(f.endswith(".safetensors") for f in files)


def release_dir(root: str) -> str | None:
    """LOAD/release when LOAD's marker says `release` (Megatron-LM's weights-only checkpoint), else None."""
    tracker = os.path.join(root or "", TRACKER)
    if not os.path.isfile(tracker):
        return None
    with open(tracker) as f:
        return os.path.join(root, RELEASE) if f.read().strip() == RELEASE else None


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def publish(save_dir: str, iteration: int):
    """Atomically point latest_checkpointed_iteration.txt at `iteration` (tmp file, fsync, os.replace).

    The iteration dir also gets a PUBLISHED file first, so a fallback only ever picks iterations that
    were published once (a save killed after writing its shards but before this call stays invisible).
    """
    open(os.path.join(iteration_dir(save_dir, iteration), PUBLISHED), "w").close()
    tmp = os.path.join(save_dir, TRACKER + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(iteration))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(save_dir, TRACKER))


def _iteration_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


_WRITE_FAILED = ("file write failed", "inline_container", "unexpected pos")


def _out_of_space(error: BaseException, save_dir: str, needed: int | None) -> bool:
    """ENOSPC anywhere in the chain (DCP wraps rank failures); torch.save's zip writer reports only 'file write
    failed' or 'unexpected pos' (inline_container.cc), which counts when the disk is indeed (nearly) full."""
    full = shutil.disk_usage(save_dir).free < (needed or 1 << 20)
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left on device" in str(e):
            return True
        if full and any(m in str(e) for m in _WRITE_FAILED):
            return True
        todo += [e.__cause__, e.__context__] + [f[0] for f in getattr(e, "failures", {}).values()
                                                if isinstance(f, tuple)]
    return False


@contextlib.contextmanager
def disk_space_checked(save_dir: str, iteration: int):
    """A save that runs out of disk raises one line, `no space left on SAVE: N bytes needed`, and removes its
    partial iteration directory (the marker still names the previous one), instead of torch's zip writer's
    'PytorchStreamWriter failed writing file ...: file write failed'."""
    try:
        yield
    except BaseException as e:
        older = [i for i in _iterations(save_dir) if i != iteration]
        needed = _iteration_bytes(iteration_dir(save_dir, older[0])) if older else None
        if not _out_of_space(e, save_dir, needed):
            raise
        shutil.rmtree(iteration_dir(save_dir, iteration), ignore_errors=True)
        free = shutil.disk_usage(save_dir).free
        raise OSError(errno.ENOSPC, f"no space left on {save_dir}: "
                      + (f"{needed} bytes needed (the size of iteration {older[0]}), {free} free"
                         if needed else f"{free} bytes free")
                      + f"; iteration {iteration} was not saved, the latest checkpoint is unchanged") from None


def record_files(save_dir: str, iteration: int) -> None:
    """Collective (every rank, after every rank's files are on disk, before `publish`): each rank checksums its
    share of the iteration's files; rank 0 writes the record."""
    import torch.distributed as dist

    path = iteration_dir(save_dir, iteration)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    shares = [manifest.record_share(path, rank, world)]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, shares[0])
        shares = gathered
    if rank == 0:
        manifest.write(path, shares)


def problem(load_dir: str, iteration: int, is_complete) -> str | None:
    """Why iteration `iteration` of `load_dir` cannot be loaded (one line naming the file), or None."""
    path = iteration_dir(load_dir, iteration)
    if not os.path.isdir(path):
        return f"{path}: no such directory"
    bad = manifest.problem(path)   # first: it names the file
    if bad is None and not is_complete(path):
        bad = f"{path}: incomplete (a save that did not finish)"
    return bad


def check_iteration(load_dir: str, iteration: int, is_complete, flag: str = "--ckpt-step") -> None:
    """An iteration the user picked: usable, or an error naming the bad file (no fallback: they asked for it)."""
    bad = problem(load_dir, iteration, is_complete)
    if bad is not None:
        raise FileNotFoundError(f"{flag} {iteration}: {bad}")


def _iterations(load_dir: str) -> list[int]:
    return sorted((int(m.group(1)) for d in os.listdir(load_dir) if (m := re.fullmatch(r"iter_(\d{7})", d))),
                  reverse=True)


def latest_iteration(load_dir: str, is_complete) -> int | None:
    """The published iteration, or the newest once-published one below it that is complete and whose files match
    their record (with a warning naming what was wrong with the newer one)."""
    tracker = os.path.join(load_dir, TRACKER)
    if not os.path.isfile(tracker):
        return None
    with open(tracker, errors="replace") as f:
        text = f.read().strip()
    if text.isdigit():
        published = int(text)
        bad = problem(load_dir, published, is_complete)
    else:
        published, bad = None, f"{tracker}: expected an iteration number, found {text[:40]!r}"
    if bad is None:
        return published
    for it in _iterations(load_dir):
        if (published is None or it < published) and os.path.exists(os.path.join(iteration_dir(load_dir, it),
                                                                                PUBLISHED)):
            if problem(load_dir, it, is_complete) is None:
                log.warning("%s; falling back to iteration %d, the newest complete one", bad, it)
                return it
    raise FileNotFoundError(f"{bad}, and no older published iteration of {load_dir} is complete")

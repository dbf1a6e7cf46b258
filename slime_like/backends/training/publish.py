"""Publish-last checkpoint directories, shared by every trainer backend.

Layout (Megatron-LM's):  SAVE/iter_0000007/...   SAVE/latest_checkpointed_iteration.txt ("7")
A save writes its iteration directory completely, then `publish` marks it PUBLISHED and atomically moves
the marker (tmp + fsync + os.replace). A save killed before the publish stays invisible; if the marker ever
names an incomplete directory, `latest_iteration` falls back to the newest complete, once-published one.
What "complete" means is the backend's (torch_dist metadata, DCP .metadata): it passes `is_complete`.
"""
from __future__ import annotations

import logging
import os
import re

TRACKER = "latest_checkpointed_iteration.txt"
PUBLISHED = "PUBLISHED"
log = logging.getLogger(__name__)


def is_hf_dir(path) -> bool:
    """An HF model directory: config.json + safetensors weights, and no iteration marker (not a training
    checkpoint of either backend)."""
    if not path or not os.path.isdir(path) or os.path.exists(os.path.join(path, TRACKER)):
        return False
    files = os.listdir(path)
    return "config.json" in files and any(f.endswith(".safetensors") for f in files)


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


def latest_iteration(load_dir: str, is_complete) -> int | None:
    """The published iteration, or the newest complete one below it if that directory is incomplete."""
    tracker = os.path.join(load_dir, TRACKER)
    if not os.path.isfile(tracker):
        return None
    text = open(tracker).read().strip()
    if not text.isdigit():
        raise ValueError(f"{tracker}: expected an iteration number, found {text!r}")
    published = int(text)
    if is_complete(iteration_dir(load_dir, published)):
        return published
    found = sorted((int(m.group(1)) for d in os.listdir(load_dir) if (m := re.fullmatch(r"iter_(\d{7})", d))),
                   reverse=True)
    for it in found:
        path = iteration_dir(load_dir, it)
        if it < published and is_complete(path) and os.path.exists(os.path.join(path, PUBLISHED)):
            log.warning("%s: iteration %d is incomplete; falling back to iteration %d", load_dir, published, it)
            return it
    raise FileNotFoundError(f"{tracker} names iteration {published} but {iteration_dir(load_dir, published)} is "
                            "incomplete and no older complete iteration exists")

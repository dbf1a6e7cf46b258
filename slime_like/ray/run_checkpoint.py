"""One checkpoint per iteration for every role of the run (issue 19): the marker that makes a save whole.

A save writes the rollout state, then each role's Megatron checkpoint (each publishes its own
`latest_checkpointed_iteration.txt`, which Megatron tools read), and LAST this run marker in the actor's
save dir:  SAVE/latest_run_iteration.json  {"iteration": N, "roles": {"actor": DIR, "critic": DIR_critic}}.
A kill between the critic's save and the actor's leaves the marker on the previous iteration, so a resume
loads that iteration for both roles (the critic's newer one is ignored, then overwritten).

A directory without the marker (written by an older slime_like, or by Megatron) resumes from the roles' own
markers, which must then agree. A critic checkpoint next to an actor dir without any is another run's
stray `_critic` folder: refused, since the critic would resume alone.
"""
from __future__ import annotations

import json
import logging
import os

MARKER = "latest_run_iteration.json"
# Megatron's per-role layout (backends/megatron/checkpoint.py), read here without importing torch in the driver.
TRACKER, PUBLISHED = "latest_checkpointed_iteration.txt", "PUBLISHED"
log = logging.getLogger(__name__)


class CheckpointMismatch(RuntimeError):
    pass


def write_marker(save_dir: str, iteration: int, role_dirs: dict) -> None:
    """Publish `iteration` as the run's checkpoint (tmp file, fsync, rename): call after every role saved."""
    path = os.path.join(save_dir, MARKER)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"iteration": iteration, "roles": role_dirs}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_marker(load_dir: str) -> dict | None:
    path = os.path.join(load_dir, MARKER)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _complete(load_dir: str, iteration: int) -> bool:
    """Written to the end and published once (dist_checkpointing writes metadata.json last)."""
    path = os.path.join(load_dir, f"iter_{iteration:07d}")
    return all(os.path.exists(os.path.join(path, f)) for f in ("metadata.json", PUBLISHED))


def _role_iteration(load_dir: str) -> int | None:
    tracker = os.path.join(load_dir, TRACKER)
    if not os.path.isfile(tracker):
        return None
    text = open(tracker).read().strip()
    return int(text) if text.isdigit() else None


def resume_iteration(actor_load: str | None, critic_load: str | None) -> int | None:
    """The iteration every role resumes from (None: a fresh start). Raises CheckpointMismatch naming the dirs."""
    if not actor_load or not os.path.isdir(actor_load):
        actor_load = None
    marker = read_marker(actor_load) if actor_load else None
    if marker is not None:
        it = int(marker["iteration"])
        missing = [d for d in (actor_load, critic_load if "critic" in marker.get("roles", {}) else None)
                   if d and not _complete(d, it)]
        if critic_load and "critic" not in marker.get("roles", {}):
            missing.append(f"{critic_load} (this run trains a critic; the checkpoint was saved without one)")
        if missing:
            raise CheckpointMismatch(f"--load {actor_load}: the run's checkpoint is iteration {it} "
                                     f"({MARKER}) but it is missing or incomplete in {missing}")
        return it
    actor_it = _role_iteration(actor_load) if actor_load else None
    critic_it = _role_iteration(critic_load) if critic_load and os.path.isdir(critic_load) else None
    if actor_it is None and critic_it is not None:
        raise CheckpointMismatch(
            f"the critic's load dir {critic_load} holds a checkpoint (iteration {critic_it}) but the actor's --load "
            f"{actor_load} has none: it is left from another run, and the critic would resume alone. Remove it, or "
            f"point --critic-load / --critic-save elsewhere")
    if critic_load and actor_it is not None and critic_it != actor_it:
        if critic_it is None:
            raise CheckpointMismatch(f"--load {actor_load} holds iteration {actor_it} but the critic's {critic_load} "
                                     f"holds no checkpoint; give --critic-load, or start the critic fresh with "
                                     f"another --save")
        common = min(actor_it, critic_it)
        if not (_complete(actor_load, common) and _complete(critic_load, common)):
            raise CheckpointMismatch(f"actor ({actor_load}: iteration {actor_it}) and critic ({critic_load}: "
                                     f"iteration {critic_it}) checkpoints disagree and share no complete iteration")
        log.warning("actor (iteration %s) and critic (iteration %s) checkpoints disagree (no %s): both resume "
                    "from iteration %d", actor_it, critic_it, MARKER, common)
        return common
    return actor_it

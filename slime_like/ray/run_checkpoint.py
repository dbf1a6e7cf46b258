"""One checkpoint per iteration for every role of the run (issue 19): the marker that makes a save whole.

A save writes the rollout state, then each role's checkpoint (torch_dist or DCP; each publishes its own
`latest_checkpointed_iteration.txt`, which Megatron tools read), and LAST this run marker in the actor's
save dir:  SAVE/latest_run_iteration.json  {"iteration": N, "roles": {"actor": DIR, "critic": DIR_critic}}.
A kill between two roles' saves leaves the marker on the previous iteration, so a resume loads that iteration
for every role (a role's newer one is ignored, then overwritten): the driver passes `resume_iteration(...)` to
each trainer's build (backends/trainer_api.py), whatever the backend.

A directory without the marker (written by an older slime_like, or by Megatron) resumes from the roles' own
markers, which must then agree. A critic checkpoint next to an actor dir without any is another run's
stray `_critic` folder: refused, since the critic would resume alone.

Before Ray starts, the chosen iteration is verified in every role (complete, published, every file's size and
CRC-32 as recorded at save, the rollout state readable): a bad one falls back to the newest older iteration that
verifies everywhere, with a warning naming the bad file; `--ckpt-step N` picks N and refuses it if it is bad.
Torch-free (training/publish.py and manifest.py import no torch at module level).
"""
from __future__ import annotations

import json
import logging
import os
import re

from slime_like.backends.training.publish import PUBLISHED, TRACKER, problem

MARKER = "latest_run_iteration.json"
log = logging.getLogger(__name__)


class CheckpointMismatch(RuntimeError):
    pass


def rollout_state_path(ckpt_dir: str, rollout_id: int) -> str:
    return os.path.join(ckpt_dir, "rollout_state", f"rollout_{rollout_id:07d}.json")


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
    """The run marker, or None when absent or unreadable (a warning names it; resume then follows the roles)."""
    path = os.path.join(load_dir, MARKER)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            marker = json.load(f)
        int(marker["iteration"])
        return marker
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s: unreadable (%s: %s); resuming from the roles' own checkpoint markers", path,
                    type(e).__name__, e)
        return None


def _complete(path: str) -> bool:
    """Written to the end by either backend (torch_dist writes metadata.json last, the FSDP trainer fsdp_meta.json)
    and published once."""
    return os.path.exists(os.path.join(path, PUBLISHED)) and any(
        os.path.exists(os.path.join(path, f)) for f in ("metadata.json", "fsdp_meta.json"))


def iteration_problem(load_dir: str, iteration: int, rollout_state_dir: str | None = None) -> str | None:
    """Why `iteration` of one role's `load_dir` cannot be resumed from (one line naming the file), or None. The
    actor's dir also holds the run's rollout state for it, which must be valid JSON when present."""
    bad = problem(load_dir, iteration, _complete)
    path = os.path.join(load_dir, f"iter_{iteration:07d}")
    # JSON the backends read (checked here too for iterations saved before the files' record existed)
    checked = [os.path.join(path, f) for f in ("metadata.json", "fsdp_meta.json")]
    if rollout_state_dir:
        checked.append(rollout_state_path(rollout_state_dir, iteration))
    for json_path in checked if bad is None else []:
        if os.path.exists(json_path):
            try:
                with open(json_path, encoding="utf-8") as f:
                    json.load(f)
            except (OSError, ValueError) as e:
                return f"{json_path}: not readable as JSON ({type(e).__name__}: {e})"
    return bad


def _role_iteration(load_dir: str) -> int | None:
    tracker = os.path.join(load_dir, TRACKER)
    if not os.path.isfile(tracker):
        return None
    text = open(tracker, errors="replace").read().strip()
    return int(text) if text.isdigit() else None


def _first_problem(dirs: list, iteration: int) -> str | None:
    for i, d in enumerate(dirs):
        bad = iteration_problem(d, iteration, rollout_state_dir=d if i == 0 else None)
        if bad:
            return bad
    return None


def _verified(dirs: list, wanted: int, ckpt_step: int | None) -> int:
    """`wanted` if every role's copy of it verifies; else (not asked for by --ckpt-step) the newest older iteration
    that every role has and that verifies, with a warning naming the bad file."""
    bad = _first_problem(dirs, wanted)
    if bad is None:
        return wanted
    if ckpt_step is not None:
        raise CheckpointMismatch(f"--ckpt-step {ckpt_step}: {bad}")
    shared = set.intersection(*({int(m.group(1)) for f in os.listdir(d) if (m := re.fullmatch(r"iter_(\d{7})", f))}
                                for d in dirs))
    for it in sorted((i for i in shared if i < wanted), reverse=True):
        if _first_problem(dirs, it) is None:
            log.warning("%s; resuming from iteration %d, the newest complete one", bad, it)
            return it
    raise CheckpointMismatch(f"--load {dirs[0]}: iteration {wanted} cannot be resumed from ({bad}), and no older "
                             f"iteration is complete in {dirs}")


def resume_iteration(actor_load: str | None, critic_load: str | None, ckpt_step: int | None = None) -> int | None:
    """The iteration every role resumes from (None: a fresh start): --ckpt-step when given, else the run's marker,
    else the roles' own markers; one whose files fail their check falls back to the newest complete iteration.
    Raises CheckpointMismatch naming the dirs or the bad file."""
    if not actor_load or not os.path.isdir(actor_load):
        actor_load = None
    marker = read_marker(actor_load) if actor_load else None
    if ckpt_step is not None:
        if actor_load is None:
            raise CheckpointMismatch(f"--ckpt-step {ckpt_step}: --load names no checkpoint directory")
        with_critic = critic_load if critic_load and (marker is None or "critic" in marker.get("roles", {})) else None
        return _verified([d for d in (actor_load, with_critic) if d], ckpt_step, ckpt_step)
    if marker is not None:
        it = int(marker["iteration"])
        if critic_load and "critic" not in marker.get("roles", {}):
            raise CheckpointMismatch(f"--load {actor_load}: the run's checkpoint is iteration {it} ({MARKER}) but "
                                     f"was saved without a critic; {critic_load} (this run trains a critic) is missing")
        dirs = [actor_load] + ([critic_load] if critic_load and "critic" in marker.get("roles", {}) else [])
        return _verified(dirs, it, None)
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
        log.warning("actor (iteration %s) and critic (iteration %s) checkpoints disagree (no %s): both resume "
                    "from iteration %d or the newest complete one below it", actor_it, critic_it, MARKER, common)
        return _verified([actor_load, critic_load], common, None)
    if actor_it is None:
        return None
    return _verified([actor_load] + ([critic_load] if critic_load else []), actor_it, None)

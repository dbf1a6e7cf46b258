"""slime's forge_load rollout: replay dumped rollouts while the engines, weight pushes and offload / onload all
keep running (slime uses it to measure GPU memory at long context without generating).

    --rollout-function-path slime.rollout.forge_load.generate_rollout   (or slime_like.rollout.forge_load...)
    --load-forge-rollout-data PATH

PATH is a dump written by --save-debug-rollout-data (JSON, or a plain torch.save from slime, read without
unpickling code). A literal path is replayed at every rollout; a `{rollout_id}` template loads one file per
rollout and falls back to rollout 0's file when a rollout has none (as slime does). Evaluation replays
`eval_<rollout_id>` files of a template, or nothing. Unlike --load-debug-rollout-data, nothing else changes:
the engines start, the weights are pushed, eval runs.
"""
from __future__ import annotations

import os

from .debug_data import load_rollout

FLAG = "--load-forge-rollout-data"


def _path(args, rollout_id: int, evaluation: bool) -> str | None:
    template = args.load_forge_rollout_data
    if not template:
        raise ValueError(f"slime_like.rollout.forge_load.generate_rollout needs {FLAG} PATH (a rollout dump, or a "
                         "{rollout_id} template of them)")
    if "{rollout_id}" not in template:
        return None if evaluation else template
    path = template.format(rollout_id=f"eval_{rollout_id}" if evaluation else rollout_id)
    if os.path.exists(path) or evaluation:
        return path if os.path.exists(path) else None
    return template.format(rollout_id=0)  # slime: a missing rollout reuses rollout 0's dump


def _groups(samples) -> list[list]:
    groups: dict[int, list] = {}
    for s in samples:
        groups.setdefault(s.group_index, []).append(s)
    return list(groups.values())


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    """The dumped samples as this rollout's groups; eval: {"forge_eval": groups} from an eval dump, or {}."""
    path = _path(args, rollout_id, evaluation)
    if evaluation:
        return {} if path is None else {"forge_eval": _groups(load_rollout(path, rollout_id, flag=FLAG))}
    return _groups(load_rollout(path, rollout_id, flag=FLAG))

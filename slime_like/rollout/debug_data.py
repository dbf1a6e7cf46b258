"""``--save-debug-rollout-data`` / ``--load-debug-rollout-data``: one rollout's samples in a file.

Written as JSON (``utils/json_dump``) whatever the file name says, e.g. slime's ``rollout_{rollout_id}.pt``
pattern: a file that might come from anyone is never unpickled. A dump that slime itself wrote
(``torch.save`` of ``{"rollout_id", "samples": [dict, ...]}``) is read with ``torch.load(weights_only=True)``,
torch's restricted loader that accepts only tensors and plain containers and runs no code.
"""
from __future__ import annotations

import logging
import math
import os

from ..utils.json_dump import is_json_file, read_json, write_json
from .serialize import sample_from_dict, sample_to_dict

logger = logging.getLogger(__name__)


def save_rollout(pattern: str, rollout_id: int, samples) -> str:
    path = write_json(pattern.format(rollout_id=rollout_id),
                      {"rollout_id": rollout_id, "samples": [sample_to_dict(s) for s in samples]})
    logger.info("saved rollout %d (%d samples) to %s", rollout_id, len(samples), path)
    return path


def load_rollout(pattern: str, rollout_id: int, subsample: float | None = None,
                 flag: str = "--load-debug-rollout-data") -> list:
    path = pattern.format(rollout_id=rollout_id)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{flag}: {path} does not exist (rollout {rollout_id}); "
                                f"was it written by --save-debug-rollout-data with the same pattern?")
    data = read_json(path) if is_json_file(path) else _load_slime_dump(path)
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise ValueError(f"{flag}: {path} is not a rollout dump (expected an object with a "
                         f"'samples' list)")
    samples = [sample_from_dict(_known_fields(d)) for d in data["samples"]]
    if subsample:   # keep whole groups: the first ceil(fraction * groups) of them
        groups = list({s.group_index: None for s in samples})
        keep = set(groups[:max(1, math.ceil(subsample * len(groups)))])
        samples = [s for s in samples if s.group_index in keep]
    return samples


def _load_slime_dump(path: str):
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError) as exc:
        raise ValueError(f"--load-debug-rollout-data: {path} is neither a JSON dump nor a plain torch.save of "
                         f"tensors and containers; it is not loaded (that would run code from the file): {exc}") from exc


def _known_fields(d: dict) -> dict:
    """slime's Sample has fields ours does not (e.g. `rollout_top_p_token_ids`); they go to metadata, not lost."""
    import dataclasses

    from ..sample import Sample

    fields = {f.name for f in dataclasses.fields(Sample)}
    extra = {k: v for k, v in d.items() if k not in fields}
    if not extra:
        return d
    out = {k: v for k, v in d.items() if k in fields}
    out["metadata"] = {**(out.get("metadata") or {}), "slime_fields": extra}
    return out

"""Sample <-> plain dict, for checkpoints (data-source buffer) and the debug rollout dumps."""
from __future__ import annotations

import dataclasses

from ..sample import Sample, Status


def sample_to_dict(sample: Sample) -> dict:
    d = dataclasses.asdict(sample)
    d["status"] = Status(sample.status).value
    return d


def sample_from_dict(d: dict) -> Sample:
    fields = {f.name for f in dataclasses.fields(Sample)}
    unknown = set(d) - fields
    if unknown:
        raise ValueError(f"sample dict has unknown fields {sorted(unknown)} (known: {sorted(fields)})")
    d = dict(d)
    d["status"] = Status(d.get("status", Status.PENDING))
    return Sample(**d)

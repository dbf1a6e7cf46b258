"""Sample <-> plain dict, for checkpoints (data-source buffer) and the debug rollout dumps.

A sample's multimodal_train_inputs (tensors: pixel_values, image_grid_thw) are written as
{"dtype", "shape", "data": flat list} so the dict stays JSON (float32 values round-trip exactly through Python
floats) and read back as tensors.
"""
from __future__ import annotations

import dataclasses

from ..sample import Sample, Status

_TENSOR_TAG = "__tensor__"


def _tensor_to_dict(t) -> dict:
    return {_TENSOR_TAG: str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "data": t.flatten().tolist()}


def _tensor_from_dict(d: dict):
    import torch

    dtype = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}.get(d[_TENSOR_TAG])
    if dtype is None:
        raise ValueError(f"sample dict: tensor dtype {d[_TENSOR_TAG]!r} is not one a sample carries")
    return torch.tensor(d["data"], dtype=dtype).reshape(d["shape"])


def sample_to_dict(sample: Sample) -> dict:
    train_inputs = sample.multimodal_train_inputs
    d = dataclasses.asdict(dataclasses.replace(sample, multimodal_train_inputs=None))
    d["status"] = Status(sample.status).value
    if train_inputs is not None:
        d["multimodal_train_inputs"] = {k: _tensor_to_dict(v) if hasattr(v, "flatten") else v
                                        for k, v in train_inputs.items()}
    return d


def sample_from_dict(d: dict) -> Sample:
    fields = {f.name for f in dataclasses.fields(Sample)}
    unknown = set(d) - fields
    if unknown:
        raise ValueError(f"sample dict has unknown fields {sorted(unknown)} (known: {sorted(fields)})")
    d = dict(d)
    d["status"] = Status(d.get("status", Status.PENDING))
    if isinstance(d.get("multimodal_train_inputs"), dict):
        d["multimodal_train_inputs"] = {k: _tensor_from_dict(v) if isinstance(v, dict) and _TENSOR_TAG in v else v
                                        for k, v in d["multimodal_train_inputs"].items()}
    return Sample(**d)

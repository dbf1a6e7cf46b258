"""megatron-core's torch_dist load strategies, reading nothing as code (training/safe_dcp.py says why and how).

dist_checkpointing.load takes its sharded and common strategies as arguments (its extension point). These are
mcore 0.16's TorchDistLoadShardedStrategy and TorchCommonLoadStrategy with:
- DCP's `.metadata` through `SafeFileSystemReader` (also for the metadata-only queries);
- stored objects (RNG state, optimizer ShardedObjects, `_extra_state`) through `SafeMCoreLoadPlanner`
  (weights-only; mcore's planner keeps its shape checks);
- `common.pt` with `torch.load(weights_only=True)` stated explicitly (torch 2.13's default, unless the
  environment says TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD).
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import ShardedTensor
from megatron.core.dist_checkpointing.strategies import torch as mcore_torch
from megatron.core.dist_checkpointing.strategies.common import COMMON_STATE_FNAME, TorchCommonLoadStrategy
from torch.distributed import checkpoint as dcp

from slime_like.backends.training.safe_dcp import (SafeFileSystemReader, WeightsOnlyBytes, refusals_unwrapped, refused,
                                                   weights_only_reason)


class SafeMCoreLoadPlanner(WeightsOnlyBytes, mcore_torch.MCoreLoadPlanner):
    def __init__(self, checkpoint_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.checkpoint_dir = checkpoint_dir


class SafeTorchDistLoadStrategy(mcore_torch.TorchDistLoadShardedStrategy):
    def load(self, sharded_state_dict, checkpoint_dir: Path):
        """mcore 0.16's TorchDistLoadShardedStrategy.load, step for step, with the safe reader and planner."""
        tensors = [t for t in nested_values(sharded_state_dict) if isinstance(t, ShardedTensor)]
        flexible = [t for t in tensors if not t.allow_shape_mismatch]
        mismatch_ok = {t.key: t for t in tensors if t.allow_shape_mismatch}
        original = sharded_state_dict
        sharded_state_dict, flat_mapping, rename_mapping = \
            mcore_torch._replace_state_dict_keys_with_sharded_keys(sharded_state_dict)
        pyt_state_dict = mcore_torch.mcore_to_pyt_state_dict(sharded_state_dict, True)
        reader = SafeFileSystemReader(checkpoint_dir)
        reader.read_metadata()   # here, not inside DCP, which folds a failure into an AssertionError of its own
        with refusals_unwrapped():
            dcp.load_state_dict(pyt_state_dict, reader, planner=SafeMCoreLoadPlanner(
                str(checkpoint_dir), shapes_validation_sharded_tensors=flexible,
                allow_shape_mismatch_sharded_tensors=mismatch_ok))
        self.cached_global_metadata = reader.read_metadata()
        mcore_state_dict = {k: mcore_torch._unwrap_pyt_sharded_tensor(v) for k, v in pyt_state_dict.items()}
        mcore_state_dict = mcore_torch._replace_sharded_keys_with_state_dict_keys(mcore_state_dict, flat_mapping,
                                                                                  rename_mapping)
        mcore_torch._restore_dict_types(mcore_state_dict, original)
        return mcore_state_dict

    def load_tensors_metadata(self, checkpoint_dir: Path, metadata=None):
        if metadata is None:
            metadata = SafeFileSystemReader(checkpoint_dir).read_metadata()
        return super().load_tensors_metadata(checkpoint_dir, metadata)

    def load_sharded_metadata(self, checkpoint_dir: Path):
        from megatron.core.dist_checkpointing.mapping import ShardedObject
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata

        metadata = SafeFileSystemReader(checkpoint_dir).read_metadata()
        out = {}
        for key, storage in metadata.state_dict_metadata.items():
            if isinstance(storage, BytesStorageMetadata):
                obj = ShardedObject.empty_from_unique_key(key)
                out[obj.unique_key] = obj
        out.update(self.load_tensors_metadata(checkpoint_dir, metadata))
        return out


class SafeCommonLoadStrategy(TorchCommonLoadStrategy):
    def load_common(self, checkpoint_dir):
        path = os.path.join(checkpoint_dir, COMMON_STATE_FNAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: missing (not a complete torch_dist checkpoint)")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise refused(path, f"it holds more than plain data ({weights_only_reason(e)})") from None

    def load_sharded_objects(self, sharded_objects_state_dict, checkpoint_dir):
        raise NotImplementedError("torch_dist stores ShardedObjects through DCP (SafeTorchDistLoadStrategy)")


def strategies() -> dict:
    """Keyword arguments for dist_checkpointing.load."""
    return {"sharded_strategy": SafeTorchDistLoadStrategy(), "common_strategy": SafeCommonLoadStrategy()}

"""Loading torch distributed checkpoints (DCP) as data: nothing in a checkpoint directory runs code.

torch's own reader unpickles DCP's `.metadata` with plain `pickle.load` and its default planner reads every stored
object (Megatron's RNG / optimizer ShardedObjects, `_extra_state`) with `torch.load(weights_only=False)`, so a
crafted file in a `--load` directory would run whatever its pickle names. Through DCP's public extension points
(a StorageReader and a LoadPlanner) both backends load instead with:

- `.metadata` through `_MetadataUnpickler`: only DCP's own metadata classes (torch 2.13's
  `distributed/checkpoint/metadata.py`, `planner.py`, `filesystem.py`), `torch.Size`, dtypes and layouts,
  and megatron-core's two empty placeholder classes for old checkpoints;
- every stored object with `torch.load(weights_only=True)` (tensors, containers, numbers, strings; numpy
  arrays for the saved numpy RNG state);
- every data file named by the metadata inside the checkpoint directory (a plain file name).

A refused file raises `CheckpointFileRefused` with one line naming the file and the global it asked for.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import re

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

_DCP = "torch.distributed.checkpoint"
_METADATA_GLOBALS = {
    (f"{_DCP}.metadata", n) for n in ("Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorProperties",
                                      "TensorStorageMetadata", "BytesStorageMetadata", "StorageMeta",
                                      "_MEM_FORMAT_ENCODING")
} | {
    (f"{_DCP}.planner", n) for n in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData",
                                     "BytesIOWriteData")
} | {
    (f"{_DCP}.filesystem", "_StorageInfo"), (f"{_DCP}.filesystem", "_StoragePrefix"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),   # StorageMeta.checkpoint_id: a path, no I/O
    # megatron-core's empty stand-ins for classes of its older checkpoints (no methods, nothing runs)
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata"),
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlan"),
}


class CheckpointFileRefused(ValueError):
    """A checkpoint file that holds more than data (or is not what its name says)."""


def refused(path, what: str) -> CheckpointFileRefused:
    return CheckpointFileRefused(f"{path}: refused: {what} (a checkpoint directory may hold data only; "
                                 "see docs/security.md)")


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file)
        self._path = path

    def find_class(self, module, name):
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise refused(self._path, f"its pickle asks for {module}.{name}, which is not DCP metadata")


def read_metadata(path: str) -> Metadata:
    """DCP's `.metadata` file at `path`, unpickled with DCP's metadata classes only."""
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, path).load()
        except CheckpointFileRefused:
            raise
        except Exception as e:  # noqa: BLE001  (truncated / garbage pickle: one line naming the file)
            raise refused(path, f"not a readable DCP metadata file ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata):
        raise refused(path, f"holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def _check_storage_paths(metadata: Metadata, path: str) -> None:
    for info in (metadata.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or os.path.basename(rel) != rel or rel in (".", ".."):
            raise refused(path, f"names data file {rel!r}, which is not a file name inside the checkpoint")


class SafeFileSystemReader(FileSystemReader):
    """torch's FileSystemReader with `.metadata` read by `read_metadata` (cached: Megatron reads it twice)."""

    def __init__(self, path):
        super().__init__(path)
        self._cached: dict = {}

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        if rank not in self._cached:
            path = str(self._get_metadata_path(rank))
            metadata = read_metadata(path)
            _check_storage_paths(metadata, path)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            self._cached[rank] = metadata
        metadata = self._cached[rank]
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _numpy_globals() -> list:
    """What torch.save writes for a numpy array (Megatron's saved numpy RNG state): reconstruct + dtype classes."""
    import numpy as np

    dtype_classes = [type(np.dtype(t)) for t in ("uint32", "int64", "float64", "float32", "bool")]
    return [np._core.multiarray._reconstruct if hasattr(np, "_core") else np.core.multiarray._reconstruct,
            np.ndarray, np.dtype, *dtype_classes]


def load_stored_object(data: io.BytesIO, where: str):
    """A DCP BYTE_IO entry (a torch.save'd object) with torch's weights-only unpickler."""
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(data, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise refused(where, f"its stored object is not plain data ({weights_only_reason(e)})") from None


def weights_only_reason(error: Exception) -> str:
    """The line of torch's weights-only refusal that names the global ("posix.system"), else its last line."""
    found = re.search(r"GLOBAL (\S+)", str(error))
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return f"its pickle asks for {found.group(1)}" if found else (lines[-1] if lines else type(error).__name__)


@contextlib.contextmanager
def refusals_unwrapped():
    """DCP wraps what a rank raised into a CheckpointException (a BaseException holding every rank's traceback);
    raise our one-line refusal itself instead."""
    try:
        yield
    except CheckpointException as e:
        for exc, _ in e.failures.values():
            if isinstance(exc, CheckpointFileRefused):
                raise exc from None
        raise


def load(state: dict, path: str) -> None:
    """dcp.load of `state` from the checkpoint directory `path`, reading nothing as code."""
    from torch.distributed import checkpoint as dcp

    reader = SafeFileSystemReader(path)
    reader.read_metadata()   # here, not inside DCP, which folds a failure into an AssertionError of its own
    with refusals_unwrapped():
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(path))


class WeightsOnlyBytes:
    """LoadPlanner mixin: stored objects are read with `load_stored_object` (DCP's default uses weights_only=False)."""

    checkpoint_dir: str = ""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        info = (self.metadata.storage_data or {}).get(read_item.storage_index) if self.metadata else None
        where = os.path.join(self.checkpoint_dir, info.relative_path) if info else self.checkpoint_dir
        obj = load_stored_object(value, f"{where} (object {read_item.dest_index.fqn!r})")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class SafeLoadPlanner(WeightsOnlyBytes, DefaultLoadPlanner):
    def __init__(self, checkpoint_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.checkpoint_dir = checkpoint_dir

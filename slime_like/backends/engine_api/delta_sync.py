"""Delta weight sync, the trainer's side (slime's --update-weight-mode delta --update-weight-transport disk).

Per sync the sending rank diffs each HF tensor's bytes against a snapshot of what the engines hold, writes only the
changed tensors' compressed deltas as one version directory under --update-weight-disk-dir (disk_delta.py's
layout, slime's), then asks every engine to /pull_weights that version into its --update-weight-local-checkpoint-dir
and to reload that copy with /update_weights_from_disk. The snapshot starts as --hf-checkpoint's bytes, which the
engines copy as version 0 at the first sync; unlike slime's first call (a snapshot only), the first sync also
publishes whatever the trainer already changed (a resumed run's weights). Same interface as the other senders.
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Iterable

import numpy as np
import torch

from slime_like.backends.engine_api import disk_delta
from slime_like.backends.engine_api.weight_sync import post_all

log = logging.getLogger(__name__)
# torch dtype -> the safetensors dtype a checkpoint names it by
_ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}


class DeltaWeightSender:
    def __init__(self, engine_urls: list[str], disk_dir: str, local_checkpoint_dir: str, hf_checkpoint: str,
                 encoding: str = "xor", checksum_format: str = "xxh3-128", keep_files: bool = False,
                 timeout_s: float = 600.0, api_key: str | None = None):
        self.engine_urls, self.disk_dir, self.local_dir = list(engine_urls), disk_dir, local_checkpoint_dir
        self.hf_checkpoint, self.encoding, self.checksum_format = hf_checkpoint, encoding, checksum_format
        self.keep_files, self.timeout_s, self.api_key = keep_files, timeout_s, api_key
        self.version = 0
        self.snapshot: dict[str, tuple[str, list, np.ndarray]] | None = None
        self.last = {}   # the last sync's byte counts: wire, changed, total

    def connect(self) -> None:
        os.makedirs(self.disk_dir, exist_ok=True)

    def _post(self, path: str, payload: dict) -> None:
        post_all(self.engine_urls, path, payload, self.timeout_s, api_key=self.api_key)

    def _pull(self, version: int) -> None:
        self._post("/pull_weights", {"local_checkpoint_dir": self.local_dir, "source_dir": self.disk_dir,
                                     "target_version": version})

    def _baseline(self) -> None:
        """Version 0: --hf-checkpoint, which every engine copies to its local dir now; a previous stream's versions
        are removed (they would apply to another base)."""
        for f in os.listdir(self.disk_dir):
            if f.startswith("weight_v"):
                shutil.rmtree(os.path.join(self.disk_dir, f), ignore_errors=True)
        self.snapshot = disk_delta.read_checkpoint(self.hf_checkpoint)
        self._pull(0)

    def _diff(self, named_tensors) -> tuple[dict, dict, dict]:
        """(compressed deltas, checksums of the new bytes, the snapshot entries to keep once the engines have them)"""
        deltas, sums, news, changed, total = {}, {}, {}, 0, 0
        for name, t in named_tensors:
            new = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().copy()
            dtype, shape, old = self._base_of(name, t)
            payload, n = disk_delta.encode(new, old, self.encoding)
            total += new.size
            if payload is not None:
                deltas[name], sums[name], changed = payload, disk_delta.checksum(self.checksum_format, new), changed + n
            news[name] = (dtype, shape, new)
        self.last = {"changed_bytes": changed, "total_bytes": total}
        return deltas, sums, news

    def _base_of(self, name: str, t: torch.Tensor):
        if name not in self.snapshot:
            raise ValueError(f"--update-weight-mode delta: the trainer sends {name!r}, which --hf-checkpoint "
                             f"{self.hf_checkpoint} does not hold, so the engines' local copies have no base for it; "
                             "use --update-weight-mode full")
        dtype, shape, old = self.snapshot[name]
        if _ST_DTYPE.get(t.dtype) != dtype or list(t.shape) != list(shape):
            raise ValueError(f"--update-weight-mode delta: {name!r} is {_ST_DTYPE.get(t.dtype, t.dtype)} "
                             f"{list(t.shape)} in the trainer but {dtype} {list(shape)} in --hf-checkpoint "
                             f"{self.hf_checkpoint}; deltas are byte-level against that checkpoint, so train in its "
                             "dtype (e.g. --bf16 for a bf16 checkpoint) or use --update-weight-mode full")
        return dtype, shape, old

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 0,
             weight_version: str | None = None) -> int:
        """Publish the changed tensors as the next version and have the engines load it; returns the bytes written
        to the shared directory. bucket_bytes: unused (one file per version)."""
        if self.snapshot is None:
            self._baseline()
        deltas, sums, news = self._diff(named_tensors)
        self.version += 1
        wire = disk_delta.write_version(self.disk_dir, self.version, deltas, sums, self.encoding,
                                        self.checksum_format)
        self._pull(self.version)
        payload = {"model_path": self.local_dir, "flush_cache": True}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        self._post("/update_weights_from_disk", payload)
        self.snapshot.update(news)
        if not self.keep_files and self.version > 1:   # every engine is past it
            shutil.rmtree(disk_delta.version_dir(self.disk_dir, self.version - 1), ignore_errors=True)
        self.last["wire_bytes"] = wire
        log.info("delta weight sync v%d: %d of %d bytes changed, %d written", self.version,
                 self.last["changed_bytes"], self.last["total_bytes"], wire)
        return wire

    def close(self, leaving: list[str] | None = None) -> None:   # no group to leave
        pass

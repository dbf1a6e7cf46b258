"""Disk-backed weight sync (slime's `--update-weight-transport disk --update-weight-disk-dir DIR`).

The sending trainer rank writes one complete HF checkpoint per sync, DIR/weights_v<version>/ (model.safetensors plus
the --hf-checkpoint's config and tokenizer files, so any engine can load the directory as a model), then asks every
engine to reload from it with SGLang's `/update_weights_from_disk {model_path, weight_version}`. DIR must be a
filesystem the engines see at the same path (a shared mount when they run on other hosts). The previous sync's
directory is removed once the engines have moved to the new one, unless `--update-weight-disk-keep-files`.
Same interface as the senders in weight_sync.py (connect / send / close).
"""
from __future__ import annotations

import os
import shutil
from typing import Iterable

import torch

from slime_like.backends.engine_api.weight_sync import post_all

# files of the --hf-checkpoint directory an engine needs besides the weights (config, tokenizer, chat template)
_MODEL_FILES = (".json", ".jinja", ".txt", ".model", ".tiktoken", ".py")


class DiskWeightSender:
    def __init__(self, engine_urls: list[str], disk_dir: str, hf_checkpoint: str | None = None,
                 keep_files: bool = False, timeout_s: float = 600.0, api_key: str | None = None):
        self.engine_urls, self.disk_dir, self.hf_checkpoint = list(engine_urls), disk_dir, hf_checkpoint
        self.keep_files, self.timeout_s, self.api_key = keep_files, timeout_s, api_key
        self.count, self.previous = 0, None

    def connect(self) -> None:  # nothing to set up: the directory is created per sync
        os.makedirs(self.disk_dir, exist_ok=True)

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 0,
             weight_version: str | None = None) -> int:
        """Write the checkpoint, have every engine load it; returns the bytes written. bucket_bytes: unused (one
        file per sync)."""
        from safetensors.torch import save_file

        self.count += 1
        version_dir = os.path.join(self.disk_dir, f"weights_v{weight_version or self.count}")
        tmp_dir = version_dir + ".partial"  # engines never see a half-written checkpoint
        shutil.rmtree(tmp_dir, ignore_errors=True)
        os.makedirs(tmp_dir)
        tensors = {n: t.detach().to("cpu", copy=True).contiguous() for n, t in named_tensors}
        save_file(tensors, os.path.join(tmp_dir, "model.safetensors"), metadata={"format": "pt"})
        self._copy_model_files(tmp_dir)
        shutil.rmtree(version_dir, ignore_errors=True)
        os.rename(tmp_dir, version_dir)
        payload = {"model_path": version_dir, "flush_cache": True}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        post_all(self.engine_urls, "/update_weights_from_disk", payload, self.timeout_s, api_key=self.api_key)
        if self.previous and self.previous != version_dir and not self.keep_files:
            shutil.rmtree(self.previous, ignore_errors=True)
        self.previous = version_dir
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _copy_model_files(self, out_dir: str) -> None:
        if not self.hf_checkpoint or not os.path.isdir(self.hf_checkpoint):
            return
        for f in os.listdir(self.hf_checkpoint):
            src = os.path.join(self.hf_checkpoint, f)
            if f.endswith(_MODEL_FILES) and not f.startswith("model.safetensors") and os.path.isfile(src):
                shutil.copy(src, os.path.join(out_dir, f))

    def close(self, leaving: list[str] | None = None) -> None:  # no group to leave; the last checkpoint stays
        pass

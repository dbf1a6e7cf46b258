"""The engine host's side of delta weight sync: SGLang's /pull_weights {local_checkpoint_dir, source_dir,
target_version}, as slime's engines are asked for it.

The local checkpoint dir holds a full copy of the served model plus a state file naming the version its files hold.
Target 0 (re)builds it from the checkpoint the engine started from; a higher target applies the published deltas
base_version -> version in order, each checked (its base is the local version, every tensor's result matches its
checksum) before any file changes. Engines sharing a host share the dir: a file lock serialises them, and the second
finds the work done. The engine then reloads the dir with /update_weights_from_disk.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil

import numpy as np

from slime_like.backends.engine_api import disk_delta
from slime_like.backends.engine_api.protocol import BadRequest


@contextlib.contextmanager
def _locked(local_dir: str):
    os.makedirs(local_dir, exist_ok=True)
    with open(os.path.join(local_dir, ".pull.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def local_version(local_dir: str) -> int | None:
    try:
        with open(os.path.join(local_dir, disk_delta.STATE)) as f:
            return json.load(f).get("version")
    except (OSError, ValueError):
        return None


def _write_state(local_dir: str, version: int | None) -> None:
    tmp = os.path.join(local_dir, disk_delta.STATE + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"version": version}, f)
    os.replace(tmp, os.path.join(local_dir, disk_delta.STATE))


def pull(local_dir: str, source_dir: str, target: int, served_model_dir: str) -> int:
    """Bring `local_dir` to version `target`; returns the number of tensors changed."""
    if not isinstance(target, int) or isinstance(target, bool) or target < 0:
        raise BadRequest(f"/pull_weights: target_version must be an integer >= 0, got {target!r}")
    real = [os.path.realpath(d) for d in (local_dir, source_dir, served_model_dir)]
    if real[0] in (real[1], real[2]) or any(os.path.commonpath([real[0], r]) in (real[0], r) for r in real[1:]):
        raise BadRequest(f"/pull_weights: local_checkpoint_dir {local_dir} must be a directory of its own, apart from "
                         f"source_dir {source_dir} and the served model {served_model_dir} (version 0 replaces its "
                         "files)")
    with _locked(local_dir):
        if target == 0:
            _materialize_base(local_dir, served_model_dir)
            return 0
        current = local_version(local_dir)
        if current is None:
            raise BadRequest(f"/pull_weights target_version {target}: {local_dir} holds no versioned checkpoint (a "
                             "previous apply was interrupted, or version 0 was never pulled); pull version 0 first")
        if target < current:
            raise BadRequest(f"/pull_weights target_version {target}: {local_dir} is already at version {current}; "
                             "versions only move forward (pull version 0 to start again from the base)")
        changed = 0
        for version in range(current + 1, target + 1):
            changed += _apply_version(local_dir, source_dir, version)
        return changed


def _materialize_base(local_dir: str, served_model_dir: str) -> None:
    _write_state(local_dir, None)          # not a usable version until every file is copied
    for f in os.listdir(local_dir):
        if f.endswith(".safetensors") or f.endswith(disk_delta.MODEL_FILES) and f != disk_delta.STATE:
            os.remove(os.path.join(local_dir, f))
    for f in os.listdir(served_model_dir):
        src = os.path.join(served_model_dir, f)
        if os.path.isfile(src) and (f.endswith(".safetensors") or f.endswith(disk_delta.MODEL_FILES)):
            shutil.copyfile(src, os.path.join(local_dir, f))
    _write_state(local_dir, 0)


def _read_index(source_dir: str, version: int) -> dict:
    path = os.path.join(disk_delta.version_dir(source_dir, version), disk_delta.INDEX)
    try:
        with open(path) as f:
            index = json.load(f)
        meta, weight_map = index["metadata"], index["weight_map"]
        base, encoding = int(meta["base_version"]), meta["delta_encoding"]
    except FileNotFoundError:
        raise BadRequest(f"/pull_weights: version {version} was not published ({path} is missing)") from None
    except (ValueError, KeyError, TypeError) as e:
        raise BadRequest(f"/pull_weights: {path} is not a delta index ({type(e).__name__}: {e})") from None
    if base != version - 1 or int(meta.get("version", version)) != version:
        raise BadRequest(f"/pull_weights: {path} is version {meta.get('version')} on base {base}; the local checkpoint "
                         f"is at version {version - 1}, so this delta does not apply to it")
    if encoding not in disk_delta.ENCODINGS or meta.get("compression_format") != disk_delta.COMPRESSION:
        raise BadRequest(f"/pull_weights: {path}: delta_encoding {encoding!r} / compression_format "
                         f"{meta.get('compression_format')!r}; expected one of {disk_delta.ENCODINGS} / zstd")
    return index


def _apply_version(local_dir: str, source_dir: str, version: int) -> int:
    from safetensors import safe_open

    index = _read_index(source_dir, version)
    meta = index["metadata"]
    vdir = disk_delta.version_dir(source_dir, version)
    local = _local_tensors(local_dir)
    patched: dict[str, np.ndarray] = {}   # local file -> its new bytes
    for name, fname in index["weight_map"].items():
        where = f"version {version} tensor {name!r}"
        if name not in local:
            raise BadRequest(f"/pull_weights {where}: not a tensor of the local checkpoint {local_dir}")
        path, start, begin, end = local[name]
        with safe_open(os.path.join(vdir, os.path.basename(fname)), framework="numpy") as f:
            delta, expected = f.get_tensor(name), (f.metadata() or {}).get(name)
        data = patched.get(path)
        if data is None:
            data = patched[path] = np.fromfile(path, dtype=np.uint8)
        new = disk_delta.apply(data[start + begin:start + end], delta, meta["delta_encoding"], where)
        got = disk_delta.checksum(meta["checksum_format"], new)
        if got != expected:
            raise BadRequest(f"/pull_weights {where}: checksum {meta['checksum_format']} of the result is {got}, the "
                             f"delta says {expected}: corrupt, or made against another base than local version "
                             f"{version - 1}; nothing was changed (pull version 0 to rebuild the local checkpoint)")
        data[start + begin:start + end] = new
    _write_state(local_dir, None)          # files change below: mid-apply is no usable version
    for path, data in patched.items():
        data.tofile(path + ".tmp")
        os.replace(path + ".tmp", path)
    _write_state(local_dir, version)
    return len(index["weight_map"])


def _local_tensors(local_dir: str) -> dict:
    out = {}
    for f in sorted(os.listdir(local_dir)):
        if f.endswith(".safetensors"):
            path = os.path.join(local_dir, f)
            start, table = disk_delta.tensor_table(path)
            out.update({k: (path, start, b, e) for k, (_, _, b, e) in table.items()})
    return out

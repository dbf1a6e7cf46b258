"""Debug dumps as JSON: readable anywhere, and loading one runs no code (no pickle).

Floats are written with Python's shortest round-trip repr, so a float32 or float64 value read back is
bit-identical: a replayed rollout gives exactly the update of the original one. Tensors become nested lists.
"""
from __future__ import annotations

import json
import os


def _plain(value):
    """JSON-able form of what dumps hold: tensors and numpy arrays as lists, enums as their value."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "value") and type(value).__module__ != "builtins":  # an Enum (e.g. Sample status)
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable ({value!r:.80}); debug dumps hold "
                    "numbers, strings, lists, dicts and tensors only")


def write_json(path: str, obj) -> str:
    """Write `obj` to `path` atomically (a reader never sees half a file); returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, default=_plain, allow_nan=True)
    os.replace(tmp, path)
    return path


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def is_json_file(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    return head[:1] in (b"{", b"[")

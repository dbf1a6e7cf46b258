"""Reading a flag's YAML (or JSON) file that must hold one mapping: the shared first step of the engine
passthrough files (`--sglang-config`, `--vllm-config`)."""
from __future__ import annotations

import os

from slime_like.config.errors import ConfigError


def load_yaml_mapping(flag: str, path: str, expected: str) -> dict:
    """The file's top-level mapping (safe_load: no code runs), or a ConfigError naming the flag and path.
    `expected` says what the mapping should hold, for the error on a non-mapping file."""
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path}: no such file")
    import yaml

    with open(path) as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{flag} {path}: not valid YAML/JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{flag} {path}: expected a mapping of {expected} to values, got {type(data).__name__}")
    return data

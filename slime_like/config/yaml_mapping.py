"""Reading a flag's YAML (or JSON) file that must hold one mapping: the shared first step of the engine
passthrough files (`--sglang-config`, `--vllm-config`)."""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.safe_yaml import read_yaml


def load_yaml_mapping(flag: str, path: str, expected: str) -> dict:
    """The file's top-level mapping (config/safe_yaml.py: no code runs, bounded), or a ConfigError naming the flag and path.
    `expected` says what the mapping should hold, for the error on a non-mapping file."""
    data = read_yaml(path, flag) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{flag} {path}: expected a mapping of {expected} to values, got {type(data).__name__}")
    return data

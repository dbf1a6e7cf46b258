"""The configuration layer: flag groups, `--sglang-*` passthrough, YAML role overlays, validation.

Nothing here imports torch, ray or transformers (the dry run must stay fast), and nothing here imports
other slime_like modules: `config/` sits at the bottom of the dependency graph.
"""
from slime_like.config.errors import ConfigError

__all__ = ["ConfigError"]

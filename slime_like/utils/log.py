"""One stdlib `logging` setup for the whole package.

    from slime_like.utils.log import get_logger
    logger = get_logger(__name__)

The level comes from `SLIME_LIKE_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR; default INFO). Only the
`slime_like` logger gets a handler, so libraries' loggers (ray, transformers) keep their own settings.
"""
from __future__ import annotations

import difflib
import logging
import os
import sys

LOG_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"
LEVEL_ENV = "SLIME_LIKE_LOG_LEVEL"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_HANDLER_NAME = "slime_like_stream"


def _resolve_level(level: str | int | None) -> int:
    if isinstance(level, int):
        return level
    name = (level or os.environ.get(LEVEL_ENV) or "INFO").strip().upper()
    if name not in _LEVELS:
        hint = difflib.get_close_matches(name, _LEVELS, n=1)
        raise ValueError(f"log level {name!r} (from {LEVEL_ENV} or level=) is not one of {', '.join(_LEVELS)}"
                         + (f"; did you mean {hint[0]!r}?" if hint else ""))
    return getattr(logging, name)


def setup_logging(level: str | int | None = None) -> logging.Logger:
    """Attach one stderr handler with LOG_FORMAT to the `slime_like` logger; idempotent (safe in every process)."""
    root = logging.getLogger("slime_like")
    root.setLevel(_resolve_level(level))
    if not any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
        root.addHandler(handler)
        root.propagate = False  # do not print twice when an application also configures the root logger
    return root


def get_logger(name: str) -> logging.Logger:
    """A logger under `slime_like` (set up on first use)."""
    setup_logging()
    if not name.startswith("slime_like"):
        name = f"slime_like.{name}"
    return logging.getLogger(name)

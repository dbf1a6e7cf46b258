"""Errors of the configuration layer (warnings and launch refusals: report.py's ConfigReport).

A `ConfigError` is bad user input (a flag, a YAML key, a file). `parse_args` turns it into
`error: ...` on stderr and exit status 2 -- argparse's own convention -- with no traceback.
"""
from __future__ import annotations

import difflib


class ConfigError(ValueError):
    """Invalid configuration: the message names the flag / key / file, the value, and the fix."""


def did_you_mean(word: str, candidates, n: int = 1) -> str:
    """' (did you mean X?)' for the closest candidate, or '' when nothing is close (difflib ratio >= 0.6)."""
    close = difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(close) + "?)"

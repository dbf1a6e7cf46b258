"""Errors and warnings of the configuration layer.

A `ConfigError` is bad user input (a flag, a YAML key, a file). `parse_args` turns it into
`error: ...` on stderr and exit status 2 -- argparse's own convention -- with no traceback.
"""
from __future__ import annotations

import difflib
import sys


class ConfigError(ValueError):
    """Invalid configuration: the message names the flag / key / file, the value, and the fix."""


def did_you_mean(word: str, candidates, n: int = 1) -> str:
    """' (did you mean X?)' for the closest candidate, or '' when nothing is close (difflib ratio >= 0.6)."""
    close = difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(close) + "?)"


def warn(args_or_none, message: str) -> None:
    """Print a start-up warning to stderr and remember it on the namespace (the dry run lists them again)."""
    print(f"WARNING: {message}", file=sys.stderr)
    if args_or_none is not None:
        args_or_none.config_warnings.append(message)


def path_problem(args, message: str) -> None:
    """Collect a missing input path: independent of every other rule, reported together at the end of
    validation (or by the preflight, which checks the same paths more deeply)."""
    args.config_path_problems.append(message)

"""Argparse `type=` converters shared by the flag groups and the YAML overlays."""
from __future__ import annotations

import argparse
import json
import re

_LIST_EXPR = re.compile(r"^[\s\d\[\]\(\)\*\+,]+$")


def moe_layer_freq(value):
    """Megatron's --moe-layer-freq: an int N (every N-th layer is MoE) or a list expression
    such as "([0]*3+[1]*45)" (1 = MoE layer). Only digits, brackets, '*', '+' and ',' are allowed,
    so evaluating the expression cannot run arbitrary code."""
    if isinstance(value, (int, list)):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if not _LIST_EXPR.match(text):
        raise argparse.ArgumentTypeError(f"{value!r} is neither an int nor a list expression like '([0]*3+[1]*45)'")
    try:
        result = eval(text, {"__builtins__": {}}, {})  # noqa: S307 -- charset restricted above
    except Exception as e:  # SyntaxError, TypeError
        raise argparse.ArgumentTypeError(f"cannot evaluate {value!r}: {e}") from None
    result = list(result) if isinstance(result, tuple) else result
    if not isinstance(result, list) or not all(v in (0, 1) for v in result):
        raise argparse.ArgumentTypeError(f"{value!r} must give a list of 0/1 per layer")
    return result


def json_value(value):
    """A JSON literal on the command line (slime passes e.g. --apply-chat-template-kwargs '{...}')."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg} at column {e.colno}): {value!r}") from None


def str2bool(value):
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {value!r}")

"""Argparse `type=` converters shared by the flag groups and the YAML overlays."""
from __future__ import annotations

import argparse
import json
import re

_TERM = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*,?\s*\]\s*(?:\*\s*(\d+))?")
MAX_LAYERS = 100_000   # far beyond any model; a bound so '[0]*10**9'-style inputs are refused, not built


def moe_layer_freq(value):
    """Megatron's --moe-layer-freq: an int N (every N-th layer is MoE) or a list expression such as
    "([0]*3+[1]*45)" (1 = MoE layer). The expression is parsed by a small grammar, never evaluated:
    ``expr := '(' expr ')' | term ('+' term)*``, ``term := '[' int (',' int)* ']' ('*' int)?``."""
    if isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"{value!r} is neither an int nor a list expression like '([0]*3+[1]*45)'")
    if isinstance(value, (int, list)):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    result = []
    for part in text.split("+"):
        m = _TERM.fullmatch(part.strip())
        if not m:
            raise argparse.ArgumentTypeError(
                f"{value!r} is neither an int nor a list expression like '([0]*3+[1]*45)' "
                f"(cannot parse {part.strip()!r})")
        items, times = [int(x) for x in m.group(1).split(",")], int(m.group(2) or 1)
        if len(result) + len(items) * times > MAX_LAYERS:
            raise argparse.ArgumentTypeError(f"{value!r} describes more than {MAX_LAYERS} layers")
        result += items * times
    if not all(v in (0, 1) for v in result):
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

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


# ---- numbers with a checked range ---------------------------------------------------------------------------
# Every int / float flag converts through one of these (tests/config/test_flag_ranges.py checks that none is
# left a bare int / float), so the same range holds for every source of a value: the command line, a role YAML
# overlay, --custom-config-path and the RLinf / ROLL front-ends, which all convert with the flag's own type.

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38   # the smallest normal float32: below it a value is 0 or subnormal
INT64_MAX = 2 ** 63 - 1
SEED_MAX = 2 ** 31 - 1                  # numpy's seed must be < 2**32; Megatron adds rank offsets to --seed


class _Ranged:
    """An argparse `type=` converter: parse, then check the range; the message says the range."""

    def __init__(self, lo=None, hi=None, *, lo_open=False, hi_open=False):
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open
        self.__name__ = self.kind  # argparse names the type in its own messages

    def describe(self) -> str:
        """'>= 1', '> 0', '<= 2', 'in [0, 1)' or 'any value'."""
        hi = None if self.hi in (None, INT64_MAX) else self.hi
        if self.lo is not None and hi is not None:
            return f"in {'(' if self.lo_open else '['}{self.lo}, {hi}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {self.lo}"
        if hi is not None:
            return f"{'<' if self.hi_open else '<='} {hi}"
        return "any value"

    def _check(self, x, value):
        low = self.lo is not None and (x < self.lo or (self.lo_open and x == self.lo))
        high = self.hi is not None and (x > self.hi or (self.hi_open and x == self.hi))
        if low or high:
            raise argparse.ArgumentTypeError(f"{value}: must be {self.describe()}")
        return x

    def __repr__(self):
        return f"{self.kind} {self.describe()}"


class Int(_Ranged):
    kind = "int"

    def __init__(self, lo=None, hi=INT64_MAX, **kw):
        super().__init__(lo, hi, **kw)

    def __call__(self, value):
        if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
            raise argparse.ArgumentTypeError(f"{value}: not an integer")
        try:
            x = int(value)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{value}: not an integer") from None
        return self._check(x, value)


class Float(_Ranged):
    """A finite float; with `float32` (the default) also one a float32 tensor holds: not past 3.4e38 and, unless
    0, not below float32's smallest normal (1e-45 is 0 or subnormal there: --rollout-repetition-penalty 1e-45
    gave NaN log-probs)."""
    kind = "float"

    def __init__(self, lo=None, hi=None, *, float32=True, **kw):
        super().__init__(lo, hi, **kw)
        self.float32 = float32

    def __call__(self, value):
        if isinstance(value, bool):
            raise argparse.ArgumentTypeError(f"{value}: not a number")
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{value}: not a number") from None
        if x != x or x in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{value}: must be a finite number")
        if self.float32 and x != 0 and not FLOAT32_TINY <= abs(x) <= FLOAT32_MAX:
            raise argparse.ArgumentTypeError(f"{value}: not representable in float32 (it would be "
                                             f"{'inf' if abs(x) > FLOAT32_MAX else '0 or subnormal'})")
        return self._check(x, value)


def ranged(action) -> _Ranged | None:
    """The range converter of an argparse action, or None."""
    return action.type if isinstance(action.type, _Ranged) else None

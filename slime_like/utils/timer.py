"""Wall-clock timers that end up as `time/<name>` metrics.

    timer = Timer()
    with timer("generate"):
        ...
    @timer("train")
    def train_step(...): ...
    metrics.update(timer.pop())          # {"time/generate": 1.23, "time/train": 0.45}

Times of the same name add up until `pop()`, so a stage entered twice in one rollout reports its total.
"""
from __future__ import annotations

import contextlib
import time


class _Section(contextlib.ContextDecorator):
    """One timed section; usable as `with` block or as a decorator (a fresh start time per entry)."""

    def __init__(self, timer: "Timer", name: str):
        self.timer, self.name = timer, name
        self._starts: list[float] = []  # a stack, so a decorated function may recurse

    def __enter__(self):
        self._starts.append(time.perf_counter())
        return self

    def __exit__(self, *exc):
        self.timer.add(self.name, time.perf_counter() - self._starts.pop())
        return False


class Timer:
    """Collects seconds per section name; `pop()` returns them as `time/<name>` and starts over."""

    def __init__(self, prefix: str = "time/"):
        self.prefix = prefix
        self._totals: dict[str, float] = {}

    def __call__(self, name: str) -> _Section:
        if not name or not isinstance(name, str):
            raise ValueError(f"Timer section name must be a non-empty string, got {name!r}")
        return _Section(self, name)

    def add(self, name: str, seconds: float) -> None:
        self._totals[name] = self._totals.get(name, 0.0) + float(seconds)

    def peek(self) -> dict[str, float]:
        return {self.prefix + k: v for k, v in self._totals.items()}

    def pop(self) -> dict[str, float]:
        out = self.peek()
        self._totals.clear()
        return out


# One process-wide timer for code that has no better place to keep one.
timer = Timer()

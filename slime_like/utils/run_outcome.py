"""What a run achieved, by one definition used everywhere (the run's summary block, the learning curve's title,
the demo's verdict):

    change = mean of the last TAIL evals after the first one  /  the first eval

The first eval is the one before the first update when the run takes it (rollout -1). One eval of 200 prompts has
a standard error of ~3 points, so the last eval alone would make the ratio jump from run to run; the mean of the
last three is steadier. A run with a single eval has no change to report.
"""
from __future__ import annotations

from dataclasses import dataclass

TAIL = 3


@dataclass(frozen=True)
class EvalChange:
    key: str
    first: float
    first_id: int
    tail_mean: float
    tail_n: int
    last: float
    last_id: int
    best: float
    best_id: int

    @property
    def ratio(self) -> float | None:
        return self.tail_mean / self.first if self.first > 0 else None

    def describe(self) -> str:
        """'0.150 (before the first update) -> 0.463 (mean of the last 3 evals, 3.09x)'."""
        when = "before the first update" if self.first_id < 0 else f"after rollout {self.first_id}"
        if not self.tail_n:
            return f"{self.first:.3f} ({when}; one eval only)"
        ratio = f", {self.ratio:.2f}x" if self.ratio is not None else ""
        evals = f"the last {self.tail_n} evals" if self.tail_n > 1 else "the last eval"
        return f"{self.first:.3f} ({when}) -> {self.tail_mean:.3f} (mean of {evals}{ratio})"


def headline_eval_key(records: list) -> str | None:
    """The first eval/<dataset>/accuracy key (else eval/<dataset>/reward) that the records hold."""
    keys = sorted(set().union(*(r.keys() for r in records))) if records else []
    for kind in ("accuracy", "reward"):
        found = [k for k in keys if k.startswith("eval/") and k.endswith("/" + kind)]
        if found:
            return found[0]
    return None


def eval_change(records: list, key: str | None = None) -> EvalChange | None:
    """The change of `key` (default: the headline eval) over the run's records (utils.metrics.read_metrics)."""
    key = key or headline_eval_key(records)
    evals = [(r["rollout_id"], r[key]) for r in records if key and r.get(key) is not None]
    if not evals:
        return None
    (first_id, first), after = evals[0], evals[1:]
    tail = [v for _, v in after[-TAIL:]]
    best_id, best = max(after or evals, key=lambda e: e[1])
    return EvalChange(key=key, first=first, first_id=first_id, tail_mean=sum(tail) / len(tail) if tail else first,
                      tail_n=len(tail), last=evals[-1][1], last_id=evals[-1][0], best=best, best_id=best_id)

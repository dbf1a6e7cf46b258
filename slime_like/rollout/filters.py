"""Dynamic-sampling filters (``--dynamic-sampling-filter-path module.func``).

Signature (slime's): ``func(args, group: list[Sample]) -> bool`` (keep the group) or an object with
a ``keep`` attribute (and optionally ``reason``). Called once per finished, scored group; a dropped
group costs a new prompt from the over-sampling pool (``--over-sampling-batch-size``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .rewards import scalar_reward


@dataclass
class FilterDecision:
    keep: bool
    reason: str | None = None


def check_reward_nonzero_std(args, group, **kwargs) -> FilterDecision:
    """Keep a group only if its rewards are not all equal (a constant group has zero GRPO advantage,
    so it would contribute no gradient: DAPO's dynamic sampling)."""
    rewards = [scalar_reward(args, s.reward) for s in group]
    keep = max(rewards) > min(rewards)
    return FilterDecision(keep, None if keep else f"all {len(rewards)} rewards equal {rewards[0]:g}")


def decide(filter_fn, args, group) -> FilterDecision:
    out = filter_fn(args, group)
    if isinstance(out, bool):
        return FilterDecision(out)
    if hasattr(out, "keep"):
        return FilterDecision(bool(out.keep), getattr(out, "reason", None))
    raise TypeError(f"--dynamic-sampling-filter-path function returned {type(out).__name__}; "
                    f"expected a bool or an object with .keep")

"""Issue 19, finding 6 (rollout side): a NaN/inf or non-number reward is caught where it appears, naming the
reward function, the prompt index and the value; --on-nonfinite-reward skip / zero drop or zero it."""
import asyncio
import math

import pytest

from slime_like.args import make_args
from slime_like.rollout.rewards import RewardFunctionError, assign_rewards
from slime_like.sample import Sample, Status

REWARDS = {}


def table_rm(args, sample):
    return REWARDS[sample.index]


def _group(n=3, group_index=7):
    return [Sample(index=group_index * n + j, group_index=group_index, prompt="p", response="r",
                   status=Status.COMPLETED) for j in range(n)]


def _args(**kw):
    return make_args(custom_rm_path=f"{__name__}.table_rm", group_rm=False, rm_type=None, reward_key=None,
                              **kw)


def _score(group, **kw):
    asyncio.run(assign_rewards(_args(**kw), group))
    return group


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_reward_fails_by_default_naming_function_prompt_and_value(bad):
    group = _group()
    REWARDS.update({s.index: 1.0 for s in group}, **{})
    REWARDS[group[1].index] = bad
    with pytest.raises(RewardFunctionError) as e:
        _score(group)
    msg = str(e.value)
    assert f"--custom-rm-path {__name__}.table_rm" in msg and "prompt index 7" in msg and str(bad) in msg


@pytest.mark.parametrize("bad", ["0.5", None, [1.0]])
def test_non_number_reward_fails_naming_function_and_value(bad):
    group = _group()
    REWARDS.update({s.index: 1.0 for s in group})
    REWARDS[group[2].index] = bad
    with pytest.raises(RewardFunctionError) as e:
        _score(group)
    assert "table_rm" in str(e.value) and repr(bad) in str(e.value)


def test_skip_marks_the_group_failed_and_zero_stores_zero():
    group = _group()
    REWARDS.update({s.index: 1.0 for s in group})
    REWARDS[group[0].index] = float("nan")
    skipped = _score(group, on_nonfinite_reward="skip")
    assert skipped[0].status == Status.FAILED and skipped[0].metadata["nonfinite_reward"] == "nan"
    zeroed = _score(_group(), on_nonfinite_reward="zero")
    assert zeroed[0].reward == 0.0 and zeroed[1].reward == 1.0 and all(math.isfinite(s.reward) for s in zeroed)
    REWARDS[group[0].index] = {"score": float("inf"), "acc": True}
    d = _score(_group(), on_nonfinite_reward="zero", )
    assert d[0].reward == {"score": 0.0, "acc": True}

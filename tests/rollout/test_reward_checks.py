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


def test_a_reward_beyond_float32_is_caught_where_it_appears():
    """Issue 31 item 8: 1e308 is a finite Python float but inf in the trainer's float32 (NaN advantages); now it
    follows --on-nonfinite-reward like inf, whose message names the flag that handles it."""
    group = _group()
    REWARDS.update({s.index: 1.0 for s in group})
    REWARDS[group[1].index] = 1e308
    with pytest.raises(RewardFunctionError, match="1e\\+308: a reward beyond float32's range .*--on-nonfinite-reward"):
        _score(group)
    REWARDS[group[1].index] = 1e308
    skipped = _score(_group(), on_nonfinite_reward="skip")
    assert skipped[1].status == Status.FAILED and skipped[1].metadata["nonfinite_reward"] == "1e+308"
    assert [s.reward for s in _score(_group(), on_nonfinite_reward="zero")] == [1.0, 0.0, 1.0]
    REWARDS[group[1].index] = 3e38          # still a float32: trained on as it is
    assert _score(_group())[1].reward == 3e38


def raising_rm(args, sample):
    if sample.index % 3 == 1:
        raise KeyError("label")
    return 1.0


def test_a_reward_function_that_raises_stops_the_run_or_drops_the_prompt():
    """Issue 31 item 8: --on-reward-error skip marks the prompt's samples FAILED (slime's status for a recoverable
    failure): the rollout drops the group and counts rollout/reward_errors."""
    from slime_like.rollout.generate import RolloutOutput, _file_group, _Gathered

    args = _args()
    args.custom_rm_path = f"{__name__}.raising_rm"
    with pytest.raises(RewardFunctionError, match="KeyError: 'label'; pass --on-reward-error skip"):
        asyncio.run(assign_rewards(args, _group()))
    args.on_reward_error = "skip"
    group = _group()
    asyncio.run(assign_rewards(args, group))
    assert all(s.status == Status.FAILED and s.reward == 0.0 for s in group)
    assert group[1].metadata["reward_error"] == "KeyError: 'label'"
    gathered = _Gathered(RolloutOutput(groups=[]))
    _file_group(args, gathered, group, target=4, filter_fn=None)
    assert gathered.result.failed == [7] and gathered.reward_errors == 3 and gathered.result.groups == []

"""Reward types on hand-written cases, including the reference graders' edge cases."""
import asyncio
from argparse import Namespace

import pytest

from slime_like.rollout.rewards import (RewardFunctionError, assign_rewards, async_rm, compute_score, rule_reward,
                                        scalar_reward)
from slime_like.sample import Sample


@pytest.mark.parametrize("response,label,expected", [
    ("the answer is \\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{2}{4}}", "1/2", 1.0),          # math-verify: equal values
    ("\\boxed{3}", "4", 0.0),
    ("no answer here", "4", 0.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("first \\boxed{7} then \\boxed{8}", "8", 0.0),  # both boxes are read as a set {7, 8}
    ("anything", "", 0.0),
])
def test_math_uses_math_verify(response, label, expected):
    assert compute_score("math", response, label) == expected


@pytest.mark.parametrize("response,label,expected", [
    ("<think>\\boxed{1}</think> so \\boxed{\\frac{1}{2}}", "0.5", 1),  # only text after </think>
    ("\\boxed{1/2}", "1/2", 0),                       # no thinking marker -> 0
    ("</think>\\boxed{2/4}", "1/2", 0),               # unreduced fraction rejected (sympy grader rule)
    ("</think>\\boxed{(1,2)}", "[1,2]", 0),           # bracket kinds must match
    ("</think>\\boxed{(2, 1)}", "(2,1)", 1),
    ("</think>\\boxed{1,000}", "1000", 1),
    ("</think>\\boxed{x = 5}", "5", 1),               # short "x =" prefix dropped
    ("</think>\\boxed{10\\%}", "10", 1),
    ("</think>\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}", 1),
    ("</think>\\boxed{\\dfrac12}", "\\boxed{\\frac{1}{2}}", 1),  # boxed label unboxed
    ("</think> 5", "5", 0),                          # no box after the marker
    ("</think>\\boxed{5}", "", 0),
    ("###Response \\boxed{5}", "5", 1),               # slime's alternative marker
    ("</think>\\boxed{5.0}", "5", 1),
    ("</think>\\boxed{5.5}", "5", 0),
])
def test_deepscaler_reference_rules(response, label, expected):
    assert compute_score("deepscaler", response, label) == expected


def test_dapo_answer_extraction_and_dict():
    out = rule_reward("dapo", "work... Answer: 42", "42")
    assert out == {"score": 1.0, "acc": True, "pred": "42"}
    assert rule_reward("dapo", "Answer: 1\nthen answer: $1,000$", "1000")["score"] == 1.0  # last Answer: wins
    bad = rule_reward("dapo", "the result is 42", "42")
    assert bad == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    assert rule_reward("dapo", "Answer: 42" + "x" * 400, "42")["score"] == -1.0  # only the last 300 chars count
    assert compute_score("dapo", "Answer: \\boxed{7}", "7") == 1.0
    with pytest.raises(ValueError, match="integer"):
        rule_reward("dapo", "Answer: x", "pi/2")


def test_f1_squad_and_yes_no():
    assert compute_score("f1", "The cat sat", "a cat sat down") == pytest.approx(0.8)  # P=1, R=2/3
    assert compute_score("f1", "yes", "no") == 0.0
    assert compute_score("f1", "yes", "Yes.") == 1.0
    assert compute_score("f1", "Paris", ["London", "paris"]) == 1.0
    assert compute_score("f1", "", "x") == 0.0


def test_gpqa_letters():
    assert compute_score("gpqa", "<think>maybe A</think>The answer is B", "B") == 1.0
    assert compute_score("gpqa", "Answer: C", "B") == 0.0
    assert compute_score("gpqa", "I pick D", 3) == 1.0                       # integer label = index
    meta = {"choices": ["red", "green blue", "black"]}
    assert compute_score("gpqa", "clearly it is green blue", "green blue", meta) == 1.0  # text match
    assert compute_score("gpqa", "option is A", "green blue", meta) == 0.0


def test_boxed_prefix_and_unknown_type():
    assert compute_score("boxed_f1", "blah Paris blah \\boxed{London}", "London") == 1.0
    assert compute_score("boxed_f1", "Paris \\boxed{London}", "Paris") == 0.0
    with pytest.raises(ValueError, match="did you mean 'deepscaler'"):
        compute_score("deepscalar", "x", "y")


def test_reward_key_and_errors():
    args = Namespace(reward_key="acc")
    assert scalar_reward(args, {"score": -1.0, "acc": False}) == 0.0
    with pytest.raises(ValueError, match="--reward-key"):
        scalar_reward(Namespace(reward_key=None), {"score": 1.0})
    with pytest.raises(KeyError, match="keys"):
        scalar_reward(Namespace(reward_key="nope"), {"score": 1.0})


# Custom reward functions used through --custom-rm-path (this test module is importable as tests.rollout...).
def length_reward(args, sample):
    return float(len(sample.response))


async def async_group_reward(args, samples):
    best = max(len(s.response) for s in samples)
    return [1.0 if len(s.response) == best else 0.0 for s in samples]


def broken_reward(args, sample):
    raise ZeroDivisionError("boom")


def _group(responses, group_index=3):
    return [Sample(index=group_index * 10 + i, group_index=group_index, response=r, label="x")
            for i, r in enumerate(responses)]


def test_custom_rm_sync_async_and_group():
    mod = __name__
    samples = _group(["a", "abc", "ab"])
    args = Namespace(custom_rm_path=f"{mod}.length_reward", group_rm=False, rm_type=None)
    assert asyncio.run(async_rm(args, samples)) == [1.0, 3.0, 2.0]
    args = Namespace(custom_rm_path=f"{mod}.async_group_reward", group_rm=True, rm_type=None)
    asyncio.run(assign_rewards(args, samples))
    assert [s.reward for s in samples] == [0.0, 1.0, 0.0]


def test_custom_rm_errors_name_prompt_and_typo():
    args = Namespace(custom_rm_path=f"{__name__}.broken_reward", group_rm=False, rm_type=None)
    with pytest.raises(RewardFunctionError, match=r"prompt index 3.*ZeroDivisionError: boom"):
        asyncio.run(assign_rewards(args, _group(["a"])))
    args = Namespace(custom_rm_path=f"{__name__}.lenght_reward", group_rm=False, rm_type=None)
    with pytest.raises(RewardFunctionError, match="did you mean"):
        asyncio.run(assign_rewards(args, _group(["a"])))


def test_metadata_rm_type_overrides_flag():
    s = Sample(response="</think>\\boxed{4}", label="4", metadata={"rm_type": "deepscaler"})
    assert asyncio.run(async_rm(Namespace(rm_type="f1", custom_rm_path=None), [s])) == [1]

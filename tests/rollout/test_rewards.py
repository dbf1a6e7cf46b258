"""Reward types on hand-written cases, including the reference graders' edge cases."""
import asyncio

import pytest

from slime_like.args import make_args
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
    args = make_args(reward_key="acc")
    assert scalar_reward(args, {"score": -1.0, "acc": False}) == 0.0
    with pytest.raises(ValueError, match="--reward-key"):
        scalar_reward(make_args(reward_key=None), {"score": 1.0})
    with pytest.raises(KeyError, match="keys"):
        scalar_reward(make_args(reward_key="nope"), {"score": 1.0})


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
    args = make_args(custom_rm_path=f"{mod}.length_reward", group_rm=False, rm_type=None)
    assert asyncio.run(async_rm(args, samples)) == [1.0, 3.0, 2.0]
    args = make_args(custom_rm_path=f"{mod}.async_group_reward", group_rm=True, rm_type=None)
    asyncio.run(assign_rewards(args, samples))
    assert [s.reward for s in samples] == [0.0, 1.0, 0.0]


def test_custom_rm_errors_name_prompt_and_typo():
    args = make_args(custom_rm_path=f"{__name__}.broken_reward", group_rm=False, rm_type=None)
    with pytest.raises(RewardFunctionError, match=r"prompt index 3.*ZeroDivisionError: boom"):
        asyncio.run(assign_rewards(args, _group(["a"])))
    args = make_args(custom_rm_path=f"{__name__}.lenght_reward", group_rm=False, rm_type=None)
    with pytest.raises(RewardFunctionError, match="did you mean"):
        asyncio.run(assign_rewards(args, _group(["a"])))


def test_metadata_rm_type_overrides_flag():
    s = Sample(response="</think>\\boxed{4}", label="4", metadata={"rm_type": "deepscaler"})
    assert asyncio.run(async_rm(make_args(rm_type="f1", custom_rm_path=None), [s])) == [1]


@pytest.mark.parametrize("response,label", [
    ("so \\boxed{2+3i}", "2+3i"),
    ("\\boxed{\\infty}", "\\infty"),
    ("\\boxed{\\{1,2,3\\}}", "\\{1,2,3\\}"),
    ("\\boxed{\\text{(B)}}", "B"),
    ("\\boxed{(1,2)}", "(1,2)"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
    ("first \\boxed{7} then \\boxed{8}", "8"),   # only the last box is the answer
])
def test_boxed_prefix_grades_the_extracted_answer(response, label):
    assert compute_score("boxed_math", response, label) == 1.0
    assert compute_score("boxed_deepscaler", response, label) == 1.0   # no </think> needed: the box is the answer
    assert compute_score("boxed_math", response + " no, \\boxed{7/3}", label) == 0.0       # a later wrong box


def test_boxed_prefix_other_graders_and_missing_box():
    assert compute_score("boxed_math", "no box at all: 5", "5") == 0.0
    assert rule_reward("boxed_dapo", "Answer: 3 ... \\boxed{5}", "5") == {"score": 1.0, "acc": True, "pred": "5"}
    assert rule_reward("boxed_dapo", "Answer: 5", "5")["score"] == -1.0          # no box: invalid
    assert compute_score("boxed_f1", "the text \\boxed{a cat sat}", "a cat sat") == 1.0
    assert compute_score("boxed_gpqa", "A is tempting but \\boxed{C}", "C") == 1.0


def test_log_multi_turn_and_correct_sample_metrics():
    from slime_like.rollout.log_extras import correct_sample_metrics, multi_turn_metrics

    args = make_args(rollout_max_response_len=8, reward_key=None)
    a = Sample(response_length=8, loss_mask=[1] * 5 + [0] * 3, rollout_log_probs=[-1.0] * 8, reward=1.0,
               metadata={"round_number": 2})
    b = Sample(response_length=2, loss_mask=[1, 1], rollout_log_probs=[-0.5, -1.5], reward=0.0,
               metadata={"round_number": 1})
    mt = multi_turn_metrics(args, [a, b])
    assert mt["multi_turn/raw_response_length/response_length_mean"] == 5.0
    assert mt["multi_turn/raw_response_length/response_length_clip_ratio"] == 0.5
    assert mt["multi_turn/wo_obs_response_length/response_length_max"] == 5
    assert mt["multi_turn/multi_turn_metric/round_number_mean"] == 1.5
    c = correct_sample_metrics(args, [a, b, Sample(response_length=3, rollout_log_probs=[-3.0] * 3, reward=1.0)])
    assert c["correct/num_samples"] == 2
    assert (c["correct_length/p50"], c["correct_length/p100"]) == (0.5, 0.5)   # 3/8 -> 2nd quarter, 8/8 -> 4th
    assert c["correct_entropy"] == pytest.approx(2.0)                          # mean of 1.0 and 3.0


def test_ifbench_is_refused_precisely():
    from slime_like.args import parse_args
    from slime_like.config.errors import ConfigError

    with pytest.raises(ValueError, match="allenai/IFBench"):
        compute_score("ifbench", "text", "label")
    with pytest.raises(ConfigError, match="--rm-type ifbench is not available.*--custom-rm-path"):
        parse_args(["--rm-type", "ifbench", "--rollout-batch-size", "1", "--num-rollout", "1"], exit_on_error=False)

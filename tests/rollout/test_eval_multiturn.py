"""Eval metrics (incl. the pass@k estimator) and the multi-turn tool example, against the CPU engine."""
import asyncio
import itertools
from math import comb

import pytest

from slime_like.backends.engine_api.client import EngineClient
from slime_like.rollout.controller import RolloutController
from slime_like.rollout.eval import pass_at_k
from slime_like.rollout.multi_turn_example import calculator

H = "rollout.hooks_for_tests"
ROWS = [{"q": f"{i}*{i}=", "a": str(i * i)} for i in range(3)]


@pytest.mark.parametrize("n,c,k", [(4, 1, 1), (4, 1, 2), (4, 2, 3), (5, 0, 2), (5, 5, 1), (6, 2, 4), (3, 1, 3)])
def test_pass_at_k_matches_subset_enumeration(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in sub) for sub in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute)
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_eval_metrics_per_dataset(engine_url, prompt_file, make_args):
    path = prompt_file(ROWS, "eval.jsonl")
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--custom-rm-path", f"{H}.reward_one_in_four",
                     "--eval-prompt-data", "tiny", path, "other", path, "--n-samples-per-eval-prompt", 4,
                     "--eval-max-response-len", 3)
    m = RolloutController(args, [engine_url]).evaluate(0)
    for name in ("tiny", "other"):
        p = f"eval/{name}/"
        # exactly one of the 4 samples of each prompt is rewarded (sample index % 4 == 0)
        assert m[p + "reward"] == pytest.approx(0.25) and m[p + "accuracy"] == pytest.approx(0.25)
        assert m[p + "pass@1"] == pytest.approx(0.25)
        assert m[p + "pass@2"] == pytest.approx(0.5)
        assert m[p + "pass@4"] == pytest.approx(1.0)
        assert 0 < m[p + "response_len/mean"] <= 3                 # the eval override applied
        assert 0 <= m[p + "truncated_ratio"] <= 1 and m[p + "num_prompts"] == 3


def test_eval_config_gives_each_dataset_its_own_settings(engine_url, prompt_file, make_args, tmp_path):
    """slime's --eval-config: defaults, then each dataset's own keys, over the command line's eval flags."""
    import yaml

    other = prompt_file([{"q": r["q"], "a": r["a"], "answer": "A"} for r in ROWS], "other.jsonl")
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump({"eval": {
        "defaults": {"n_samples_per_eval_prompt": 2, "max_response_len": 2},
        "datasets": [{"name": "short", "path": prompt_file(ROWS, "eval.jsonl")},
                     {"name": "long", "path": other, "max_response_len": 6, "n_samples_per_eval_prompt": 1,
                      "label_key": "answer", "custom_rm_path": f"{H}.reward_label_is_answer_field",
                      "temperature": 0.0}]}}))
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--custom-rm-path", f"{H}.reward_length",
                     "--eval-config", str(cfg), "--n-samples-per-eval-prompt", 4, "--eval-max-response-len", 3)
    assert args.eval_prompt_data[0::2] == ["short", "long"]
    ctl = RolloutController(args, [engine_url])
    m = ctl.evaluate(0)
    ctl.close()
    assert m["eval/short/pass@2"] >= 0 and "eval/short/pass@4" not in m        # defaults: 2 samples, not the CLI's 4
    assert 0 < m["eval/short/response_len/mean"] <= 2                          # defaults: 2 tokens, not the CLI's 3
    assert m["eval/short/reward"] == pytest.approx(m["eval/short/response_len/mean"])  # the run's reward function
    assert m["eval/long/reward"] == 1.0 and "eval/long/pass@2" not in m        # its own reward, label key, n = 1
    assert m["eval/long/response_len/mean"] > 3 or m["eval/long/truncated_ratio"] < 1  # up to 6 tokens


@pytest.mark.parametrize("entry, message", [
    ({"name": "x", "path": "p.jsonl", "app_service": "http://h"}, r"key 'app_service' is not honoured by slime_like"),
    ({"name": "x", "path": "p.jsonl", "temprature": 0.5}, r"eval.datasets\[0\] \(x\) has unknown key 'temprature'"),
    ({"name": "x"}, r"eval.datasets\[0\] \(x\) needs a `path` string"),
    ({"name": "x", "path": "p.jsonl", "top_p": 2}, r"top_p: 2 is not valid"),
])
def test_eval_config_mistakes_are_named(make_args, prompt_file, tmp_path, entry, message):
    import yaml

    from slime_like.config.errors import ConfigError

    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump({"eval": {"datasets": [entry]}}))
    with pytest.raises(ConfigError, match=message):
        make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--eval-config", str(cfg))


def test_calculator_tool():
    assert calculator("2 + 3*4") == "14"
    assert calculator("__import__('os')").startswith("error")


def test_multi_turn_tool_tokens_are_masked(engine_url, prompt_file, make_args):
    from slime_like.tools.tiny_model import build_char_tokenizer

    tok = build_char_tokenizer()
    prompt = ROWS[0]["q"]

    async def greedy():
        async with EngineClient(engine_url) as c:
            return await c.generate(tok(prompt)["input_ids"], {"temperature": 0, "max_new_tokens": 4})

    # The random tiny model never writes "</tool>", so the tool call marker is the first character it
    # writes greedily: each turn then ends with a tool call and the environment answers.
    marker = asyncio.run(greedy())["text"][0]
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--rollout-max-response-len", 60,
                     "--custom-rm-path", f"{H}.reward_length", "--rollout-temperature", 1.0,
                     "--custom-generate-function-path", "slime_like.rollout.multi_turn_example.generate",
                     tool_call_end=marker, max_tool_turns=2)
    args.rollout_temperature = 0.0
    samples, _ = RolloutController(args, [engine_url]).generate(0)
    s = samples[0]
    calls = s.metadata["tool_calls"]
    assert 1 <= calls <= 2                   # turn 1 surely calls the tool; later turns depend on the model
    assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) == len(s.tokens) - s.prompt_length
    response_ids = s.tokens[s.prompt_length:]
    env_text = tok.decode([t for t, m in zip(response_ids, s.loss_mask) if m == 0])
    model_text = tok.decode([t for t, m in zip(response_ids, s.loss_mask) if m == 1])
    assert env_text.count("<result>") == calls and env_text.endswith("</result>")
    assert "<result>" not in model_text and model_text.count(marker) >= calls
    assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m == 0)
    assert tok.decode(response_ids) == s.response

"""Data and sampling features the RLinf / ROLL front-ends use: JSON-array files, prompt templates, sampling params,
the eval order shuffle."""
import json

from slime_like.rollout.data_source import load_prompts
from slime_like.rollout.generate import sampling_params_from_args
from slime_like.tools.tiny_model import build_char_tokenizer


def test_json_array_file(tmp_path, make_args):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([{"q": "1+1=", "a": "2"}, {"q": "2+2=", "a": "4"}], indent=2))
    tok = build_char_tokenizer()
    records = load_prompts(str(path), tok, "q", "a")
    assert [r["label"] for r in records] == ["2", "4"] and [r["row"] for r in records] == [1, 2]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"q": "1"}, 3]')
    try:
        load_prompts(str(bad), tok, "q")
    except ValueError as e:
        assert "array entry 2: expected a JSON object" in str(e)
    else:
        raise AssertionError("a non-object entry was accepted")


def test_prompt_templates(tmp_path, prompt_file, make_args, tiny_ckpt):
    from transformers import AutoTokenizer

    data = prompt_file([{"q": "hi", "a": "x"}])
    args = make_args(data, "--rollout-batch-size", 1, "--prompt-template", "qwen2_5")
    assert args.apply_chat_template and "<|im_start|>" in args.apply_chat_template_kwargs["chat_template"]
    tok = AutoTokenizer.from_pretrained(tiny_ckpt)
    rec = load_prompts(data, tok, "q", "a", apply_chat_template=True,
                       template_kwargs=args.apply_chat_template_kwargs)[0]
    text = tok.decode(rec["prompt_ids"])
    # the tiny tokenizer has no whitespace tokens: compare without it
    assert "".join(text.split()).endswith("<|im_start|>userhi<|im_end|><|im_start|>assistant")
    assert not make_args(data, "--rollout-batch-size", 1, "--prompt-template", "plain").apply_chat_template


def test_sampling_params_carry_the_new_rollout_flags(prompt_file, make_args):
    data = prompt_file([{"q": "hi", "a": "x"}])
    p = sampling_params_from_args(make_args(data, "--rollout-batch-size", 1, "--rollout-greedy", "--rollout-repetition-penalty", "1.2",
                                            "--rollout-min-new-tokens", "2"))
    assert p["temperature"] == 0.0 and p["repetition_penalty"] == 1.2 and p["min_new_tokens"] == 2
    p = sampling_params_from_args(make_args(data, "--rollout-batch-size", 1))
    assert "repetition_penalty" not in p and "min_new_tokens" not in p and p["temperature"] == 1.0


def test_repetition_penalty_and_min_new_tokens_reach_the_cpu_engine(engine_url):
    """Real HTTP: with min_new_tokens = max_new_tokens the response is never cut short by eos."""
    import urllib.request

    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "min_new_tokens": 6, "temperature": 0.0,
                                                        "repetition_penalty": 1.5}}
    from slime_like.utils.auth import auth_headers

    req = urllib.request.Request(engine_url + "/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", **auth_headers()})
    out = json.loads(urllib.request.urlopen(req, timeout=60).read())
    assert out["meta_info"]["completion_tokens"] == 6


def test_several_prompt_files_are_one_dataset(tmp_path, prompt_file, make_args):
    from slime_like.rollout.data_source import RolloutDataSource

    first = prompt_file([{"q": "a", "a": "1"}, {"q": "b", "a": "2"}], name="one.jsonl")
    second = tmp_path / "two.json"
    second.write_text(json.dumps([{"q": "c", "a": "3"}]))
    args = make_args(first, "--rollout-batch-size", 1, "--prompt-data-extra", second)
    ds = RolloutDataSource(args, build_char_tokenizer())
    assert [r["label"] for r in ds.records] == ["1", "2", "3"]

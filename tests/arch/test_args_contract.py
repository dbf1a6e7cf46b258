"""One args contract: Namespaces come from the real parser (slime_like.args.make_args / parse_args), readers say
`args.x`, and a start builds the parser once and the placement plan once."""
import io
import json
import os
import re
from contextlib import redirect_stdout

import pytest

from slime_like.args import make_args

# slime_like.tools.tiny_model's default architecture (qwen2), as its config.json says it
TINY_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
              "max_position_embeddings": 256}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_make_args_holds_every_dest_and_refuses_a_name_no_flag_has():
    args = make_args("--rollout-batch-size", 4, rm_max_retries=3)
    assert args.rollout_batch_size == 4 and args.rm_max_retries == 3
    assert args.rollout_seed == 42 and args.cli_dests == [] and args.megatron_role_overrides == {}  # bookkeeping
    with pytest.raises(AttributeError, match="rm_max_retry"):
        make_args(rm_max_retry=3)


def test_no_default_carrying_attribute_reads_outside_the_kept_kinds():
    """getattr(args, "x", default) re-applies a default the parser owns; the kept reads are of attributes that
    exist only at some stages (docs/architecture.md, "One args contract")."""
    kept = set()  # run facts (the resume iteration) are passed to the trainer build, never written into args
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "slime_like")):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(folder, name)).read()
                found += re.findall(r'getattr\((?:self\.)?args, "([a-z_0-9]+)", ', text)
                assert not re.search(r"\b_get\((?:self\.)?args, ", text), f"{name}: a _get(args, ...) helper is back"
    assert set(found) <= kept, sorted(set(found) - kept)


def _placeholder_run(tmp_path) -> list:
    """A dry-run command line over a placeholder checkpoint (config.json and the file names the preflight wants)."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(TINY_QWEN2))
    for name in ("tokenizer.json", "model.safetensors"):
        (hf / name).write_text("")
    data = tmp_path / "train.jsonl"
    data.write_text('{"input": "1+1=", "label": "2"}\n')
    return ["--hf-checkpoint", str(hf), "--prompt-data", str(data), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--num-rollout", "1", "--colocate", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1", "--dry-run"]


def test_a_start_builds_the_parser_once_and_the_plan_once(tmp_path, monkeypatch):
    import slime_like.args as A
    from slime_like.config import parser as P
    from slime_like.ray import entry

    builds, plans = [], []
    real_build, real_plan = P.build_parser, A.build_plan
    monkeypatch.setattr(P, "build_parser", lambda *a, **k: builds.append(a) or real_build(*a, **k))
    monkeypatch.setattr(A, "build_plan", lambda args: plans.append(args) or real_plan(args))
    P._shared_parser.cache_clear()  # as in a fresh process
    out = io.StringIO()
    with redirect_stdout(out):
        assert entry.launch(None, _placeholder_run(tmp_path), prog="train.py") == 0
    P._shared_parser.cache_clear()  # the next test's parser is built without the counter
    assert "configuration valid" in out.getvalue() and "placement" in out.getvalue().lower()
    assert len(builds) == 1, f"the parser was built {len(builds)} times in one start"
    assert len(plans) == 1, f"the plan was computed {len(plans)} times in one start"

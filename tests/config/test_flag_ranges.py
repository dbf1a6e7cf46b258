"""Every numeric flag has a checked range (issue 31 item 5), and the same range holds for every source of a value:
the command line, a role YAML overlay, --custom-config-path and an RLinf / ROLL file all convert through the flag's
own type (config/types.py Int / Float). The probes of the issue, each refused before Ray with the flag and value."""
import argparse
import os

import pytest

from cfg_helpers import parse
from slime_like.config.errors import ConfigError
from slime_like.config.parser import build_parser
from slime_like.config.types import FLOAT32_TINY, Float, Int, ranged

HERE = os.path.dirname(os.path.abspath(__file__))
RLINF1 = os.path.join(HERE, "frontend_files", "rlinf_seed001.yaml")


def _numeric_actions():
    parser, _ = build_parser()
    return [a for a in parser._actions if a.type in (int, float) or ranged(a) is not None]


def test_every_numeric_flag_has_a_range():
    actions = _numeric_actions()
    assert len(actions) > 150
    bare = [a.option_strings[0] for a in actions if a.type in (int, float)]
    assert bare == [], f"numeric flags without a range (use config.types.Int / Float): {bare}"


def test_every_default_is_inside_its_range():
    for a in _numeric_actions():
        defaults = a.default if isinstance(a.default, list) else [a.default]
        for d in defaults:
            if d is not None:
                ranged(a)(d)  # raises ArgumentTypeError if the flag's own default were refused


@pytest.mark.parametrize("extra, message", [
    (["--rollout-repetition-penalty", "1e-45"], "--rollout-repetition-penalty: 1e-45: not representable in float32"),
    (["--lr", "nan"], "--lr: nan: must be a finite number"),
    (["--lr", "inf"], "--lr: inf: must be a finite number"),
    (["--seed", "100000000000000000000000"], "--seed: 100000000000000000000000: must be in [0, 2147483647]"),
    (["--seed", "1e23"], "--seed: 1e23: not an integer"),
    (["--rollout-max-response-len", "0"], "--rollout-max-response-len: 0: must be >= 1"),
    (["--micro-batch-size", "0"], "--micro-batch-size: 0: must be >= 1"),
    (["--rollout-temperature", "1e39"], "--rollout-temperature: 1e39: not representable in float32"),
    (["--rollout-top-p", "0"], "--rollout-top-p: 0: must be in (0, 1]"),
])
def test_the_probes_are_refused_on_the_command_line(base, extra, message):
    with pytest.raises(ConfigError) as e:
        parse(base + extra)
    assert message in str(e.value)


def test_a_role_overlay_gets_the_same_range(base, tmp_path):
    """micro_batch_size: 0 in an overlay was accepted (the YAML skipped the command line's checks)."""
    roles = tmp_path / "roles.yaml"
    roles.write_text("megatron:\n  - role: actor\n    overrides: {micro_batch_size: 0}\n")
    with pytest.raises(ConfigError) as e:
        parse(base + ["--megatron-config-path", roles])
    assert "micro_batch_size" in str(e.value) and "must be >= 1" in str(e.value), str(e.value)
    roles.write_text("megatron:\n  - role: critic\n    overrides: {lr: .nan}\n")
    with pytest.raises(ConfigError) as e:
        parse(base + ["--use-critic", "--megatron-config-path", roles])
    assert "lr" in str(e.value) and "finite" in str(e.value), str(e.value)


def test_custom_config_gets_the_same_range(base, tmp_path):
    cfg = tmp_path / "custom.yaml"
    cfg.write_text("rollout_repetition_penalty: 1.0e-45\n")
    with pytest.raises(ConfigError) as e:
        parse(base + ["--custom-config-path", cfg])
    assert "rollout_repetition_penalty" in str(e.value) and "float32" in str(e.value), str(e.value)


def test_an_rlinf_file_gets_the_same_range(hf_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    argv = ["--config", RLINF1, f"rollout.model_dir={hf_dir}", f"actor.tokenizer.tokenizer_model={hf_dir}",
            f"data.train_data_paths=[{data}]", f"data.val_data_paths=[{data}]", "data.answer_key=answer"]
    parse(argv)  # valid as shipped
    with pytest.raises(ConfigError) as e:
        parse(argv + ["algorithm.group_size=0"])
    assert "--n-samples-per-prompt" in str(e.value) and "must be >= 1" in str(e.value), str(e.value)


def test_converters():
    assert Int(1)("3") == 3 and Int(1)(4.0) == 4
    for bad in ("0", True, 2.5, "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            Int(1)(bad)
    f = Float(0, 2, lo_open=True)
    assert f("2") == 2.0 and f(FLOAT32_TINY) == FLOAT32_TINY
    for bad in ("0", "2.5", "nan", "-inf", "1e-40", True):
        with pytest.raises(argparse.ArgumentTypeError):
            f(bad)
    assert Float(None, None, float32=False)("1e-300") == 1e-300


def test_prompt_data_empty_save_unwritable_and_context_too_small(base, tmp_path):
    from cfg_helpers import parse_report

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1="}\n')
    ok = base + ["--prompt-data", data, "--input-key", "prompt"]
    from slime_like.args import parse_run

    def error(extra):
        with pytest.raises(ConfigError) as e:
            parse_run([str(a) for a in ok + extra], exit_on_error=False, preflight=True)
        return str(e.value)

    assert "--prompt-data '': an empty path" in error(["--prompt-data", ""])
    assert "--save /proc/self/x: cannot create directories in /proc/self" in error(["--save", "/proc/self/x"])
    assert "--sglang-context-length 1: must exceed --rollout-max-response-len" in \
        error(["--sglang-context-length", "1"])
    assert "--sglang-context-length 64: must exceed --rollout-max-response-len (64)" in \
        error(["--sglang-context-length", "64", "--rollout-max-response-len", "64"])
    parse_run([str(a) for a in ok + ["--save", tmp_path / "new" / "ckpt"]], exit_on_error=False, preflight=True)
    assert not (tmp_path / "new").exists()  # the write check leaves nothing behind


def test_vllm_on_cpu_with_offload_is_refused_at_launch_not_in_the_engine(base, monkeypatch):
    from cfg_helpers import parse_report

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # this machine as a CPU host, whatever it has
    _, report = parse_report(base + ["--rollout-engine", "vllm"])
    assert any("--offload-rollout" in r and "--no-offload-rollout" in r for r in report.launch_refusals)
    _, report = parse_report(base + ["--rollout-engine", "vllm", "--no-offload-rollout"])
    assert not any("--offload-rollout" in r for r in report.launch_refusals)

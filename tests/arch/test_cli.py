"""The `slime-like` command as a user runs it (`python -m slime_like`, the same function as the installed
console script): its commands, its errors, the wrappers that keep slime's `python train.py` recipes working, and
a bare start that lists what a run needs in one message."""
import json
import os
import subprocess
import sys

import pytest

import slime_like
from slime_like.cli import COMMANDS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*argv, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.fixture
def tiny_hf(tmp_path):
    """A placeholder HF directory the dry run accepts (config.json of a small Qwen2; nothing is loaded)."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "torch_dtype": "float32"}))
    (hf / "tokenizer.json").write_text("{}")
    (hf / "model.safetensors").write_text("")
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    return hf


def dry_run_flags(tmp_path, hf):
    return ["--hf-checkpoint", str(hf), "--prompt-data", str(tmp_path / "train.jsonl"), "--input-key", "prompt",
            "--label-key", "label", "--rm-type", "math", "--rollout-batch-size", "4", "--num-rollout", "2",
            "--colocate", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
            "--run-dir", str(tmp_path / "run")]


def test_help_version_and_an_unknown_command():
    r = run("-m", "slime_like", "--help")
    assert r.returncode == 0 and all(f"slime-like {c}" in r.stdout for c in COMMANDS), r.stdout
    r = run("-m", "slime_like", "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"slime_like {slime_like.__version__}"
    r = run("-m", "slime_like", "trian")
    assert r.returncode == 2 and "unknown command 'trian' (did you mean train?)" in r.stderr
    r = run("-m", "slime_like", "convert", "hf-to-mcore")
    assert r.returncode == 2 and "hf-to-megatron or megatron-to-hf (got 'hf-to-mcore')" in r.stderr


def test_the_version_is_setup_pys():
    text = open(os.path.join(ROOT, "setup.py")).read()
    assert "version=VERSION" in text and '"slime-like = slime_like.cli:main"' in text
    r = run("setup.py", "--version")
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == slime_like.__version__


@pytest.mark.parametrize("entry", [["train.py"], ["-m", "slime_like", "train"], ["train_async.py"]])
def test_a_bare_start_lists_what_a_run_needs(entry):
    r = run(*entry)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    for need in ("--hf-checkpoint DIR", "--prompt-data FILE", "--rollout-batch-size N", "--rm-type NAME",
                 "--colocate", "--dry-run"):
        assert need in r.stderr, need
    assert "is required" not in r.stderr  # one message, not the first missing flag's complaint


def test_dry_run_command_equals_train_py_dry_run(tmp_path, tiny_hf):
    flags = dry_run_flags(tmp_path, tiny_hf)
    cli = run("-m", "slime_like", "dry-run", *flags, cwd=tmp_path)  # from any directory
    script = run("train.py", "--dry-run", *flags)
    assert cli.returncode == 0 and script.returncode == 0, cli.stderr + script.stderr
    assert "configuration valid" in cli.stdout and cli.stdout == script.stdout
    bad = run("-m", "slime_like", "dry-run", *flags, "--rollout-temprature", "1")
    assert bad.returncode == 2 and bad.stderr.startswith("slime-like dry-run: error: unknown flag --rollout-temprature")


def test_convert_reaches_the_tools_own_checks(tmp_path):
    r = run("-m", "slime_like", "convert", "megatron-to-hf", "--load", str(tmp_path))
    assert r.returncode != 0 and r.stderr.strip().startswith("slime-like convert megatron-to-hf: error: ")
    assert "--hf-checkpoint, --save-hf required" in r.stderr
    r = run(os.path.join("tools", "convert_megatron_to_hf.py"), "--load", str(tmp_path))  # the checkout's wrapper
    assert r.returncode != 0 and r.stderr.strip().startswith("convert_megatron_to_hf.py: error: ")

"""`pip install slime_like` (the light core: pyyaml, omegaconf) gives a working `slime-like dry-run`, as a new user
gets it: in a fresh venv outside the checkout, with no torch, aiohttp, ray or transformers installed (issue 32).

The preflight trusts slime_like's own default functions by a table (config/slime_paths.OWN_FUNCTIONS) instead of
importing them (they need the `rollout` extra); this file proves the table right by importing each one here, and
proves that a user's function whose imports need an extra names the extra to install."""
import json
import os
import re
import runpy
import subprocess
import sys

import pytest
import setuptools
from _package_copy import ROOT, copy_checkout, venv_env

from slime_like.config.install_extras import EXTRA_OF_MODULE
from slime_like.config.preflight import CALL_SHAPES, import_and_bind
from slime_like.config.provenance import write_config
from slime_like.config.slime_paths import ALIASES, OWN_FUNCTIONS

HEAVY = ("torch", "aiohttp", "ray", "transformers", "megatron")
PACKAGE_OF = {"math_verify": "math-verify", "megatron": "megatron-core"}


def test_own_functions_import_and_fit_their_flags():
    """Every entry of the table the preflight trusts without importing: it imports and binds to each flag's call."""
    for path, dests in OWN_FUNCTIONS.items():
        for dest in dests:
            assert import_and_bind(path, "--" + dest.replace("_", "-"), CALL_SHAPES[dest]) is None, (path, dest)
    assert set(ALIASES.values()) <= set(OWN_FUNCTIONS)  # slime's paths of our functions are trusted alike


def test_each_module_of_the_extras_table_is_in_that_extra(monkeypatch):
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))  # read setup.py's arguments only
    monkeypatch.chdir(ROOT)
    runpy.run_path(os.path.join(ROOT, "setup.py"))
    extras = captured["extras_require"]
    for module, extra in EXTRA_OF_MODULE.items():
        package = PACKAGE_OF.get(module, module).lower()
        names = [re.split(r"[\[=<>~!]", r, maxsplit=1)[0].lower() for r in extras[extra]]
        assert package in names, (module, extra, extras[extra])
    assert captured["entry_points"]["console_scripts"] == ["slime-like = slime_like.cli:main"]


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory):
    """A fresh venv with `pip install <a copy of the checkout>`: the light core only (from the package index)."""
    src, env_dir = copy_checkout(tmp_path_factory.mktemp("light"))
    python = str(env_dir / "bin" / "python")
    r = subprocess.run([python, "-m", "pip", "install", "-q", str(src)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return env_dir


def _in_venv(env_dir, argv, cwd):
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=venv_env(env_dir), timeout=300)


def _placeholder_run(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True}))
    (hf / "tokenizer.json").write_text("{}")
    (hf / "model.safetensors").write_text("")
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    return ["--hf-checkpoint", str(hf), "--prompt-data", str(tmp_path / "train.jsonl"), "--input-key", "prompt",
            "--label-key", "label", "--rollout-batch-size", "4", "--num-rollout", "2", "--colocate",
            "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1", "--run-dir", str(tmp_path / "run")]


def test_dry_run_in_a_fresh_venv_with_the_light_core_only(light_venv, tmp_path):
    python = str(light_venv / "bin" / "python")
    absent = _in_venv(light_venv, [python, "-c", "import importlib.util as u; "
                                   f"print([m for m in {HEAVY!r} if u.find_spec(m)])"], tmp_path)
    assert absent.stdout.strip() == "[]", absent.stdout + absent.stderr
    flags = _placeholder_run(tmp_path)
    # slime's recipes name slime's default rollout function; the demo's reward is ours
    for extra in (["--rm-type", "math"],
                  ["--custom-rm-path", "slime_like.demo.arith.reward",
                   "--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout"]):
        r = _in_venv(light_venv, ["slime-like", "dry-run", *flags, *extra], tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "== slime_like dry run: configuration valid ==" in r.stdout and "-- placement plan --" in r.stdout
        # only what a user set or can set: no bookkeeping of the parse
        for internal in ("hf_model_type", "vllm_cli_options", "vllm_server_args", "custom_config", "dry_run =",
                         " = None", " = {}"):
            assert internal not in r.stdout, internal
    same = _in_venv(light_venv, [python, "-m", "slime_like", "dry-run", *flags, "--rm-type", "math"], tmp_path)
    assert same.returncode == 0 and same.stdout.startswith("== slime_like dry run")
    version = _in_venv(light_venv, ["slime-like", "--version"], tmp_path)
    assert version.stdout.strip().startswith("slime_like 0.")


def test_a_user_function_needing_an_extra_names_the_extra(light_venv, tmp_path):
    (tmp_path / "my_reward.py").write_text("import aiohttp\n\n\ndef score(args, sample):\n    return 1.0\n")
    r = _in_venv(light_venv, ["slime-like", "dry-run", *_placeholder_run(tmp_path),
                              "--custom-rm-path", "my_reward.score"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert ("slime-like dry-run: error: --custom-rm-path my_reward.score: cannot import module 'my_reward': it "
            'needs aiohttp, which is not installed here; pip install "slime_like[rollout]"') in r.stderr, r.stderr
    # a run without the extras stops with one line naming them, before anything starts
    (tmp_path / "t").mkdir()
    r = _in_venv(light_venv, ["slime-like", "train", *_placeholder_run(tmp_path / "t"), "--rm-type", "math"],
                 tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "slime-like train: error: a run needs ray, aiohttp, torch, transformers, megatron, which are not installed "
        'here (this install is the light core, enough for --dry-run): pip install "slime_like[megatron,ray,rollout]" '
        '(or "slime_like[all]": everything a CPU machine runs)'), r.stderr
    assert not (tmp_path / "t" / "run").exists()  # refused before the run directory is written


def test_the_run_records_its_version(tmp_path):
    import yaml

    import slime_like
    from slime_like.args import make_args
    from slime_like.config.report import ConfigReport

    args = make_args(run_dir=str(tmp_path))
    args.cli_dests = []
    path = write_config(args, ConfigReport(), ["--run-dir", str(tmp_path)])
    assert yaml.safe_load(open(path))["slime_like_version"] == slime_like.__version__

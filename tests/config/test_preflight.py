"""The preflight (slime_like/config/preflight.py) on real bad files, a real YAML and real user modules, through
train.py's own entry (`main(argv)`): every problem of one start in one message, exit 2, before Ray."""
import os
import sys

import pytest

import train

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GOOD = b'{"prompt": "1+1=", "label": "2"}\n'


def main(argv) -> int:
    """train.py's exit status for `argv` (a configuration error exits 2 from parse_args)."""
    try:
        return train.main(argv)
    except SystemExit as e:
        return e.code


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.fixture
def data(tmp_path):
    lines = [GOOD] * 100
    lines[49] = b'{"prompt": "49+1=", "label": \n'           # line 50: cut short
    lines[60] = b'{"prompt": "caf\xe9", "label": "1"}\n'      # line 61: Latin-1, not UTF-8
    lines[70] = b'{"question": "x", "label": "1"}\n'          # line 71: the --input-key is missing
    return {"bad": _write(tmp_path / "bad.jsonl", b"".join(lines)),
            "bom": _write(tmp_path / "bom.jsonl", b"\xef\xbb\xbf" + GOOD * 3),
            "latin1": _write(tmp_path / "latin1.jsonl", GOOD + b'{"prompt": "\xff", "label": "1"}\n')}


def _ppo(base, prompt_data, *extra):
    ppo_yaml = os.path.join(REPO, "scripts", "configs", "ppo.yaml")  # the shipped overlay: critic warm-up 10
    return [*base, "--prompt-data", prompt_data, "--input-key", "prompt", "--label-key", "label",
            "--advantage-estimator", "ppo", "--megatron-config-path", ppo_yaml, *extra]


def test_every_independent_problem_in_one_message(base, data, tmp_path, capsys):
    empty = tmp_path / "empty_hf"
    empty.mkdir()
    (tmp_path / "my_rm.py").write_text("def score(args):\n    return 1.0\n")
    sys.path.insert(0, str(tmp_path))
    try:
        argv = _ppo(base, data["bad"], "--use-kl-loss", "--ref-load", str(tmp_path / "no_ref"),
                    "--custom-rm-path", "my_rm.score", "--eval-prompt-data", "held", data["latin1"])
        argv[argv.index("--hf-checkpoint") + 1] = str(empty)
        for extra in ([], ["--dry-run"]):
            assert main(argv + extra) == 2
            err = capsys.readouterr().err
            assert "error: 6 problems, all found before starting:" in err, err
            assert f"--prompt-data: {data['bad']}:50: malformed JSON" in err and "(3 bad lines in all)" in err
            assert f"--eval-prompt-data held: {data['latin1']}:2: not UTF-8: byte 0xff at column 13" in err
            assert f"--hf-checkpoint {empty}: is empty; expected a Hugging Face model directory" in err
            assert f"--ref-load {tmp_path / 'no_ref'}: no such file or directory" in err
            assert ("role critic: LR warm-up (10 steps) must be shorter than the decay horizon (2 steps); "
                    f"{os.path.join(REPO, 'scripts', 'configs', 'ppo.yaml')} entry megatron[1] (role critic) sets "
                    "lr_warmup_iters: 10: lower it there") in err
            assert ("--custom-rm-path my_rm.score: it will be called as score(args, sample) but its signature is "
                    "score(args)") in err
            assert "Traceback" not in err
    finally:
        sys.path.remove(str(tmp_path))


def test_bad_lines_of_each_kind_and_a_bom(base, data, tmp_path, capsys):
    grpo = [*base, "--input-key", "prompt", "--label-key", "label", "--dry-run"]
    assert main(grpo + ["--prompt-data", data["bom"]]) == 0  # a UTF-8 BOM is accepted
    missing_key = _write(tmp_path / "keys.jsonl", GOOD + b'{"question": "x", "label": "1"}\n')
    assert main(grpo + ["--prompt-data", missing_key]) == 2
    err = capsys.readouterr().err
    assert f"{missing_key}:2: no key 'prompt' (--input-key); keys present: ['label', 'question']" in err
    assert "(the only bad line)" in err
    not_object = _write(tmp_path / "list.jsonl", b"[1, 2]\n")
    assert main(grpo + ["--prompt-data", not_object]) == 2
    assert f"{not_object}:1: expected a JSON object, got list" in capsys.readouterr().err


def test_hf_checkpoint_file_and_missing_parts(base, tmp_path, capsys):
    hf = base[base.index("--hf-checkpoint") + 1]
    argv = list(base) + ["--dry-run"]
    argv[argv.index("--hf-checkpoint") + 1] = os.path.join(hf, "config.json")
    assert main(argv) == 2
    assert "config.json: is a file, not a directory; pass the model directory" in capsys.readouterr().err
    os.remove(os.path.join(hf, "model.safetensors"))
    assert main(list(base) + ["--dry-run"]) == 2
    assert f"--hf-checkpoint {hf}: has no weights (*.safetensors)" in capsys.readouterr().err


def test_custom_function_import_errors_name_the_flag(base, tmp_path, capsys):
    argv = [*base, "--dry-run", "--custom-rm-path", "no_such_module_xyz.score",
            "--dynamic-sampling-filter-path", "slime_like.rollout.filters.decid"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--custom-rm-path no_such_module_xyz.score: cannot import module 'no_such_module_xyz'" in err
    assert ("--dynamic-sampling-filter-path slime_like.rollout.filters.decid: module 'slime_like.rollout.filters' "
            "has no 'decid' (did you mean slime_like.rollout.filters.decide?)") in err


def test_load_dirs(base, tmp_path, capsys):
    save = tmp_path / "save"
    assert main([*base, "--dry-run", "--load", str(save)]) == 0  # a fresh run whose --load is its --save
    (save / "iter_0000003").mkdir(parents=True)
    assert main([*base, "--dry-run", "--load", str(save)]) == 2
    assert "has iter_0000003 but no latest_checkpointed_iteration.txt" in capsys.readouterr().err


def test_eval_config_reward_types_are_checked_at_start(base, tmp_path, capsys):
    """An --eval-config dataset's own rm_type is checked like --rm-type: ifbench (and a misspelt type) stop the
    start, naming the file and the dataset, instead of passing start-up and raising at the first eval."""
    import yaml

    good = _write(tmp_path / "eval.jsonl", GOOD * 4)
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump({"eval": {"datasets": [
        {"name": "ifeval", "path": good, "rm_type": "ifbench"},
        {"name": "mathy", "path": good, "rm_type": "mth"},
        {"name": "fine", "path": good, "rm_type": "boxed_math"},
        {"name": "own", "path": good, "rm_type": "ifbench", "custom_rm_path": "os.path.join"}]}}))
    train_data = _write(tmp_path / "train.jsonl", GOOD * 4)
    assert main(base + ["--prompt-data", train_data, "--input-key", "prompt", "--label-key", "label",
                        "--rm-type", "math", "--eval-config", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "2 problems, all found before starting" in err
    assert (f"--eval-config {cfg} dataset ifeval: its rm_type: --rm-type ifbench is not available in slime_like"
            in err)
    assert f"--eval-config {cfg} dataset mathy: its rm_type: --rm-type 'mth' is not a known reward type" in err
    assert "did you mean 'math'?" in err and "dataset fine" not in err and "dataset own" not in err


def test_megatron_release_checkpoints_are_accepted(base, tmp_path, capsys):
    """Megatron-LM's converter marks a weights-only checkpoint with the text 'release' (its read_metadata reads
    it as iteration 0; the weights are in release/): accepted for --load, --ref-load, --critic-load and
    --opd-teacher-load; a 'release' marker without release/ is a clear error."""
    from slime_like.config.preflight_files import check_megatron_load, check_ref_load

    release = tmp_path / "release_ckpt"
    (release / "release").mkdir(parents=True)
    (release / "release" / "metadata.json").write_text("{}")
    (release / "release" / "common.pt").write_bytes(b"")
    (release / "latest_checkpointed_iteration.txt").write_text("release\n")
    for flag in ("--load", "--critic-load", "--opd-teacher-load"):
        assert check_megatron_load(str(release), flag, fresh_ok=False) == [], flag
    assert check_ref_load(str(release)) == []
    assert main([*base, "--dry-run", "--load", str(release), "--ref-load", str(release), "--use-kl-loss"]) == 0
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "latest_checkpointed_iteration.txt").write_text("release")
    assert main([*base, "--dry-run", "--load", str(broken)]) == 2
    assert (f"--load {broken}: latest_checkpointed_iteration.txt says release but release/ holds no torch_dist "
            "checkpoint") in capsys.readouterr().err


def test_quantized_hf_checkpoint_is_refused_at_launch(tmp_path):
    """An FP8 checkpoint (config.json quantization_config, as DeepSeek-V3's / Qwen3-FP8's) was accepted silently
    while the pushed weights were never re-quantized: now a launch refusal that names the layout and the fix."""
    import json

    from cfg_helpers import TINY_QWEN2, refuse_at_launch, write_hf_dir
    from slime_like.config.errors import ConfigError

    fp8 = {**TINY_QWEN2, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                                   "weight_block_size": [128, 128]}}
    hf = write_hf_dir(tmp_path / "fp8", fp8)
    argv = ["--hf-checkpoint", hf, "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout", "2",
            "--colocate"]
    with pytest.raises(ConfigError, match=r"--hf-checkpoint .*fp8 is a quantized checkpoint \(config.json "
                                          r"quantization_config: quant_method: fp8, fmt: e4m3, weight_block_size: "
                                          r"\[128, 128\]\).*use the BF16 checkpoint"):
        refuse_at_launch(argv)
    refuse_at_launch(["--hf-checkpoint", write_hf_dir(tmp_path / "bf16"), *argv[2:]])  # unquantized: runs
    assert json.load(open(tmp_path / "bf16" / "config.json")).get("quantization_config") is None


def test_trainer_threads_follow_omp_num_threads_and_bad_train_env_is_refused_with_the_rest(base, data, monkeypatch,
                                                                                        capsys):
    from slime_like.config.train_env import trainer_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert trainer_threads(1) == max(1, os.cpu_count() or 2) and trainer_threads(10 ** 6) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert trainer_threads(1) == 3 and trainer_threads(2) == 3     # the user's value, per rank, never overridden
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    assert main([*base, "--prompt-data", data["latin1"], "--input-key", "prompt", "--label-key", "label"]) == 2
    err = capsys.readouterr().err
    assert "error: 2 problems, all found before starting:" in err, err
    assert "OMP_NUM_THREADS='two' in the environment: it sets each trainer rank's torch threads" in err
    assert f"--prompt-data: {data['latin1']}:2: not UTF-8" in err
    monkeypatch.delenv("OMP_NUM_THREADS")
    for value, message in (('{"OMP_NUM_THREADS": 0}', "OMP_NUM_THREADS='0' in --train-env-vars: it sets each trainer"),
                           ('["A=1"]', "--train-env-vars ['A=1']: expected a JSON object of variable names to values"),
                           ('{"A": {"b": 1}}', "--train-env-vars: 'A': each entry must be NAME: value")):
        assert main([*base, "--prompt-data", data["bom"], "--train-env-vars", value]) == 2
        assert message in capsys.readouterr().err, value
    assert trainer_threads(1, {"OMP_NUM_THREADS": "2"}) == 2

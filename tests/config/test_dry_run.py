"""`train.py --dry-run` and the example recipes, as real subprocesses: exit 0 with the report, or exit 2 with a
one-line error and no traceback."""
import json
import os
import subprocess
import sys

import pytest

from published_configs import PUBLISHED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def placeholders(tmp_path):
    """Placeholder checkpoint/data paths for the recipes: Qwen2.5-7B's config.json, empty ref dir and data files."""
    hf = tmp_path / "Qwen2.5-7B"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(PUBLISHED["qwen2.5-7B"]))
    (hf / "tokenizer.json").write_text("{}")  # names the preflight looks for; never loaded by a dry run
    (hf / "model.safetensors").write_text("")
    (tmp_path / "ref" / "iter_0000001").mkdir(parents=True)  # a torch_dist checkpoint's layout
    (tmp_path / "ref" / "latest_checkpointed_iteration.txt").write_text("1")
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    (tmp_path / "aime.jsonl").write_text('{"prompt": "2+2=", "label": "4"}\n')
    env = dict(os.environ, PYTHON=sys.executable, HF_CKPT=str(hf), REF_LOAD=str(tmp_path / "ref"),
               SAVE_DIR=str(tmp_path / "save"), PROMPT_DATA=str(tmp_path / "train.jsonl"),
               EVAL_DATA=str(tmp_path / "aime.jsonl"), OMP_NUM_THREADS="1")
    env.pop("SLIME_LIKE_SGLANG_PASSTHROUGH", None)
    return env


def run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_grpo_recipe_dry_run(placeholders):
    r = run(["bash", "scripts/run-qwen2.5-7B-grpo.sh", "--dry-run"], placeholders)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "configuration valid" in out and "-- batch arithmetic --" in out and "-- placement plan --" in out
    assert "= global_batch_size 256 x num_steps_per_rollout 1" in out
    assert "actor parallelism     = 8 GPUs = DP 4 x TP 2 x PP 1 x CP 1" in out
    assert "gpu 7 (bundle   7): actor7 + engine3" in out  # colocated, 2 GPUs per engine
    assert "--mem-fraction-static 0.7" in out and "kl_loss_type = low_var_kl" in out
    assert "Traceback" not in r.stderr


def test_ppo_recipe_dry_run_shows_both_roles(placeholders):
    r = run(["bash", "scripts/run-qwen2.5-7B-ppo.sh", "--dry-run"], placeholders)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "-- role critic: values not shared by every role --" in out
    critic = out.split("-- role critic")[1].split("--\n", 1)[1].split("\n-- ")[0]
    assert "lr = 1e-05" in critic and "lr_warmup_iters = 10" in critic and "save = " in critic
    assert "actor: 4 rank(s), critic: 2 rank(s), engines: 1 x 2 GPU(s)" in out
    assert "gpu 4 (bundle   4): critic0" in out and "gpu 6 (bundle   6): engine0" in out


def test_recipe_with_a_typo_fails_cleanly(placeholders):
    r = run(["bash", "scripts/run-qwen2.5-7B-grpo.sh", "--dry-run", "--rollout-temprature", "0.7"], placeholders)
    assert r.returncode == 2
    assert "unknown flag --rollout-temprature (did you mean --rollout-temperature?)" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_config_error_exits_2_without_traceback(placeholders, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("megatron:\n  - role: critic\n    overrides: {lrr: 1e-5}\n")
    r = run(["bash", "scripts/run-qwen2.5-7B-ppo.sh", "--dry-run", "--megatron-config-path", str(bad)], placeholders)
    assert r.returncode == 2 and "unknown key 'lrr' (did you mean lr?)" in r.stderr
    assert "Traceback" not in r.stderr
    r = run([sys.executable, "train.py", "--dry-run", "--rollout-batch-size", "4"], placeholders)
    assert r.returncode == 2 and r.stderr.startswith("train.py: error: ") and "Traceback" not in r.stderr


def test_dry_run_imports_no_heavy_module(placeholders):
    """parse_args + the dry run never import torch, ray or transformers (they cost seconds)."""
    code = ("import sys; from train import main; rc = main(sys.argv[1:]); "
            "heavy = [m for m in ('torch', 'ray', 'transformers') if m in sys.modules]; "
            "print('HEAVY', heavy); sys.exit(rc)")
    r = run([sys.executable, "-c", code, "--dry-run", "--hf-checkpoint", placeholders["HF_CKPT"],
             "--rollout-batch-size", "8", "--num-rollout", "1", "--colocate", "--num-gpus-per-node", "8"], placeholders)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout


def test_help_exits_0(placeholders):
    r = run([sys.executable, "train.py", "--help"], placeholders)
    assert r.returncode == 0 and "perf/parallelism:" in r.stdout and "algorithm (GRPO/PPO):" in r.stdout


def test_slurm_job_dry_run_needs_no_allocation(placeholders, tmp_path):
    """`DRY_RUN=1 bash scripts/slurm/ppo.sbatch`: the job's own flags checked and planned outside Slurm."""
    env = dict(placeholders, DRY_RUN="1", NODES="2", GPUS_PER_NODE="8", RUN_DIR=str(tmp_path / "run"))
    for var in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        env.pop(var, None)
    r = run(["bash", "scripts/slurm/ppo.sbatch"], env)
    assert r.returncode == 0, r.stderr
    assert "-- placement plan --" in r.stdout and "2 node(s) x 8 GPU slots" in r.stdout
    assert (tmp_path / "run" / "plan.txt").exists()

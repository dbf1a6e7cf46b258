"""The tiny job script on a real 2-node Slurm: Ray head + worker started with srun, training across both nodes,
teardown that leaves no process behind."""
import json
import time
from pathlib import Path

import pytest

from multinode_helpers import REPO, processes_with, wait_for_job

JOB_TIMEOUT_S = 330
REWARD_KEYS = ("rollout/reward", "rollout/reward_mean", "rollout/raw_reward")  # the loop's name first


@pytest.mark.slow
def test_tiny_job_two_nodes(local_slurm, tiny_ckpt, tmp_path):
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    out = tmp_path / "job-%j.out"
    sub = local_slurm.run(
        "sbatch", "--parsable", "-N2", f"--output={out}",
        f"--export=ALL,SLIME_LIKE_ROOT={REPO},RUN_DIR={run_dir},RAY_LOG_DIR={logs},RAY_WAIT_TIMEOUT=150,"
        f"TINY_CKPT={tiny_ckpt},CLUSTER_CHECK=0",
        str(REPO / "scripts" / "slurm" / "tiny.sbatch"), check=False)
    assert sub.returncode == 0, f"sbatch failed: {sub.stderr}"
    job_id = sub.stdout.strip().split(";")[0]
    state = wait_for_job(local_slurm, job_id, JOB_TIMEOUT_S)
    log = Path(str(out).replace("%j", job_id))
    text = log.read_text() if log.exists() else "(no job log)"
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", \
        f"job {job_id} ended {state['JobState']} exit {state['ExitCode']}; log tail:\n{text[-4000:]}"

    # Both Slurm nodes joined the Ray cluster, each with its GPU slot (SLURM_GPUS_ON_NODE=1) ...
    assert "ray cluster ready: 2 node(s), 2 GPU slot(s)" in text, text[-4000:]
    # ... after the flags were checked: the plan puts one actor rank and one engine on each node (each node has
    # one GPU slot, so the two DP ranks cannot share a node: the gloo group really spans both Slurm nodes).
    plan = (run_dir / "plan.txt").read_text()
    assert "2 node(s) x 1 GPU slots" in plan and "actor: 2 rank(s)" in plan and "node 1:" in plan, plan

    # It trained: metrics.jsonl has every rollout with a logged reward and an optimizer step.
    metrics = run_dir / "metrics.jsonl"
    assert metrics.exists(), f"no {metrics}; log tail:\n{text[-4000:]}"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    assert [r["rollout_id"] for r in rows] == [0, 1], rows
    for row in rows:
        reward = next((row[k] for k in REWARD_KEYS if row.get(k) is not None), None)
        assert reward is not None and 0.0 <= reward <= 1.0, row
        assert row.get("actor/num_steps", 0) >= 1 and "actor/loss" in row, row

    # Teardown: no process of the job (Ray workers inherit SLURM_JOB_ID) and no Ray session dir left.
    assert processes_with(marker_env=f"SLURM_JOB_ID={job_id}", marker_cmd=f"/tmp/ray_{job_id}/") == []
    assert not Path(f"/tmp/ray_{job_id}").exists()
    assert f"ray cluster of job {job_id} stopped (exit status 0)" in text


@pytest.mark.slow
@pytest.mark.parametrize("how", ["scancel", "batch-signal"])
def test_stopped_job_leaves_nothing(local_slurm, tmp_path, how):
    """Stop a job while its driver holds actors on both nodes. `scancel`: Slurm signals every step and the trap
    cleans up. `batch-signal` (`scancel --batch --signal=TERM`, what `#SBATCH --signal=B:TERM@T` sends before
    the time limit): only the batch shell is signalled, so the trap alone must stop the driver and both nodes."""
    out = tmp_path / "hold.out"
    sub = local_slurm.run("sbatch", "--parsable", f"--output={out}",
                          f"--export=ALL,SLIME_LIKE_ROOT={REPO},RAY_LOG_DIR={tmp_path},RAY_WAIT_TIMEOUT=150",
                          str(Path(__file__).with_name("hold.sbatch")), check=False)
    assert sub.returncode == 0, f"sbatch failed: {sub.stderr}"
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 240
    while "holding actors" not in (out.read_text() if out.exists() else ""):
        state = local_slurm.job_state(job_id)["JobState"]
        if state not in ("PENDING", "CONFIGURING", "RUNNING") or time.monotonic() > deadline:
            local_slurm.run("scancel", job_id, check=False)
            pytest.fail(f"job {job_id} ({state}) never held its actors; log:\n{out.read_text() if out.exists() else ''}")
        time.sleep(1)
    assert processes_with(marker_cmd=f"/tmp/ray_{job_id}/"), "the Ray nodes of the held job are not running"

    if how == "scancel":
        local_slurm.run("scancel", job_id)
    else:
        local_slurm.run("scancel", "--batch", "--signal=TERM", job_id)
    state = wait_for_job(local_slurm, job_id, 120)
    text = out.read_text()
    assert state["JobState"] == ("CANCELLED" if how == "scancel" else "FAILED"), (state, text[-3000:])
    assert processes_with(marker_env=f"SLURM_JOB_ID={job_id}", marker_cmd=f"/tmp/ray_{job_id}/") == [], text[-3000:]
    assert not Path(f"/tmp/ray_{job_id}").exists()
    assert "signal received, stopping" in text and f"ray cluster of job {job_id} stopped" in text, text[-3000:]


@pytest.fixture
def placeholder_models(tmp_path):
    """config.json of the recipes' models (their published values) and empty data / ref paths: enough for --dry-run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("published_configs", REPO / "tests" / "config" / "published_configs.py")
    published = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(published)
    for name in ("qwen2.5-7B", "qwen2.5-32B"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(published.PUBLISHED[name]))
        (tmp_path / name / "tokenizer.json").write_text("{}")  # names the preflight looks for; never loaded
        (tmp_path / name / "model.safetensors").write_text("")
    (tmp_path / "ref" / "iter_0000001").mkdir(parents=True)  # a torch_dist checkpoint's layout
    (tmp_path / "ref" / "latest_checkpointed_iteration.txt").write_text("1")
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("script, model, expect", [
    ("grpo.sbatch", "qwen2.5-32B", ["2 node(s) x 4 GPU slots, colocated", "actor: 8 rank(s), engines: 2 x 4 GPU(s)",
                                    "gpu 3 (bundle   7): actor7 + engine1"]),
    ("ppo.sbatch", "qwen2.5-7B", ["2 node(s) x 4 GPU slots, disaggregated",
                                  "actor: 4 rank(s), critic: 2 rank(s), engines: 1 x 2 GPU(s)",
                                  "gpu 0 (bundle   4): critic0", "gpu 3 (bundle   7): engine0"]),
])
def test_example_job_scripts_plan_from_the_allocation(local_slurm, placeholder_models, tmp_path, script, model,
                                                      expect):
    """The GRPO / PPO job scripts size the run from Slurm's allocation (-N2, 4 GPUs per node here) and check it
    with --dry-run before any Ray node starts."""
    p = placeholder_models
    out = tmp_path / "job.out"
    sub = local_slurm.run(
        "sbatch", "--parsable", "-N2", "--gres=gpu:4", f"--output={out}",
        f"--export=ALL,SLIME_LIKE_ROOT={REPO},DRY_RUN=1,HF_CKPT={p / model},REF_LOAD={p / 'ref'},"
        f"SAVE_DIR={p / 'save'},PROMPT_DATA={p / 'train.jsonl'},EVAL_DATA={p / 'train.jsonl'},RUN_DIR={p / 'run'},"
        f"RAY_LOG_DIR={tmp_path / 'logs'}",
        str(REPO / "scripts" / "slurm" / script), check=False)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    state = wait_for_job(local_slurm, job_id, 120)
    text = out.read_text()
    assert state["JobState"] == "COMPLETED", text[-3000:]
    for line in expect:
        assert line in text, text[-3000:]
    assert "ray head" not in text.lower() and not Path(f"/tmp/ray_{job_id}").exists()  # DRY_RUN: no Ray


@pytest.mark.slow
def test_job_script_reports_bad_flags_before_starting_ray(local_slurm, tiny_ckpt, tmp_path):
    """A typo in the extra train.py flags fails the job in seconds, with the flag named, and no Ray node started."""
    out = tmp_path / "job.out"
    sub = local_slurm.run("sbatch", "--parsable", "-N2", f"--output={out}",
                          f"--export=ALL,SLIME_LIKE_ROOT={REPO},RUN_DIR={tmp_path / 'run'},TINY_CKPT={tiny_ckpt},"
                          f"RAY_LOG_DIR={tmp_path / 'logs'}",
                          str(REPO / "scripts" / "slurm" / "tiny.sbatch"), "--rollout-temprature", "0.7", check=False)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    state = wait_for_job(local_slurm, job_id, 120)
    text = out.read_text()
    assert state["JobState"] == "FAILED" and state["ExitCode"].startswith("2:"), (state, text[-2000:])
    assert "--rollout-temprature" in text and "--rollout-temperature" in text, text[-2000:]
    assert "Ray head on" not in text and not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_job_without_gpus_names_the_fix(local_slurm, tiny_ckpt, tmp_path):
    """No GPUs in the allocation and no RAY_NUM_GPUS: the job stops before Ray, saying how to declare GPU slots."""
    out = tmp_path / "job.out"
    sub = local_slurm.run("sbatch", "--parsable", "-N1", "--gres=gpu:0", f"--output={out}",
                          f"--export=ALL,SLIME_LIKE_ROOT={REPO},RUN_DIR={tmp_path / 'run'},TINY_CKPT={tiny_ckpt}",
                          str(REPO / "scripts" / "slurm" / "tiny.sbatch"), check=False)
    assert sub.returncode == 0, sub.stderr
    state = wait_for_job(local_slurm, sub.stdout.strip().split(";")[0], 60)
    text = out.read_text()
    assert state["JobState"] == "FAILED", (state, text)
    assert "no GPU count for the Ray nodes" in text and "RAY_NUM_GPUS=N" in text, text

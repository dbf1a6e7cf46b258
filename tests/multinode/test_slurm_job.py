"""The tiny job script on a real 2-node Slurm: Ray head + worker started with srun, training across both nodes,
teardown that leaves no process behind."""
import json
import time
from pathlib import Path

import pytest

from multinode_helpers import REPO, processes_with, wait_for_job

JOB_TIMEOUT_S = 330
# train.py's loop is not wired end to end yet: until it is, the job runs the dry-run plan and the Ray driver check
# only (TINY_TRAIN=0), and the training assertions are off.
TRAIN = False


@pytest.mark.slow
def test_tiny_job_two_nodes(local_slurm, tmp_path):
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    out = tmp_path / "job-%j.out"
    sub = local_slurm.run(
        "sbatch", "--parsable", "-N2", f"--output={out}",
        f"--export=ALL,SLIME_LIKE_ROOT={REPO},RUN_DIR={run_dir},RAY_LOG_DIR={logs},RAY_WAIT_TIMEOUT=150,TINY_TRAIN={int(TRAIN)}",
        str(REPO / "scripts" / "slurm" / "tiny.sbatch"), check=False)
    assert sub.returncode == 0, f"sbatch failed: {sub.stderr}"
    job_id = sub.stdout.strip().split(";")[0]
    state = wait_for_job(local_slurm, job_id, JOB_TIMEOUT_S)
    log = Path(str(out).replace("%j", job_id))
    text = log.read_text() if log.exists() else "(no job log)"
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", \
        f"job {job_id} ended {state['JobState']} exit {state['ExitCode']}; log tail:\n{text[-4000:]}"

    # Both Slurm nodes joined the Ray cluster and each offered its GPU slot (SLURM_GPUS_ON_NODE=1).
    check = json.loads((run_dir / "cluster_check.json").read_text())
    assert check["errors"] == [] and check["nodes"] == 2 and check["gpus"] == 2, check
    assert "ray cluster ready: 2 node(s), 2 GPU slot(s)" in text

    # The flags were checked before Ray started: the plan puts one actor rank and one engine on each node.
    plan = (run_dir / "plan.txt").read_text()
    assert "2 node(s) x 1 GPU slots" in plan and "node 1:" in plan, plan
    if TRAIN:  # it trained: metrics.jsonl with a logged reward for every rollout
        metrics = run_dir / "metrics.jsonl"
        assert metrics.exists(), f"no {metrics}; log tail:\n{text[-4000:]}"
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        rewards = [r["rollout/reward_mean"] for r in rows if r.get("rollout/reward_mean") is not None]
        assert len(rewards) >= 2 and all(0.0 <= r <= 1.0 for r in rewards), rows

    # Teardown: no process of the job (Ray workers inherit SLURM_JOB_ID) and no Ray session dir left.
    assert processes_with(marker_env=f"SLURM_JOB_ID={job_id}", marker_cmd=f"/tmp/ray_{job_id}/") == []
    assert not Path(f"/tmp/ray_{job_id}").exists()
    assert f"ray cluster of job {job_id} stopped (exit status 0)" in text


@pytest.mark.slow
def test_cancelled_job_leaves_nothing(local_slurm, tmp_path):
    """scancel while a driver holds actors on both nodes: the trap stops the driver and both Ray nodes."""
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

    local_slurm.run("scancel", job_id)
    state = wait_for_job(local_slurm, job_id, 120)
    text = out.read_text()
    assert state["JobState"] == "CANCELLED", state
    assert processes_with(marker_env=f"SLURM_JOB_ID={job_id}", marker_cmd=f"/tmp/ray_{job_id}/") == [], text[-3000:]
    assert not Path(f"/tmp/ray_{job_id}").exists()
    assert "signal received, stopping" in text and f"ray cluster of job {job_id} stopped" in text, text[-3000:]

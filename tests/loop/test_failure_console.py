"""The console when an actor dies under a run (issue 31 item 9): train.py as a user runs it, two trainer ranks,
rank 0 killed with SIGKILL in rollout 1's train step (what the kernel's OOM killer does). One block says which
actor (by role and rank), where, why and where the details are; no Ray traceback or raylet notice beside it."""
import os
import subprocess
import sys

import pytest

from conftest import REPO, loop_argv

pytestmark = pytest.mark.slow


def test_a_trainer_rank_killed_mid_run_is_one_block_naming_it(tiny_ckpt, toy_prompts, tmp_path):
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--colocate", "--actor-num-gpus-per-node", "2",
                     "--micro-batch-size", "32", "--num-rollout", "3",
                     "--custom-megatron-before-train-step-hook-path", "trainer_faults.sigkill_rank_0_at_rollout_1")
    r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), *argv], capture_output=True, text=True,
                       cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=900)
    out = r.stdout + r.stderr
    log = tmp_path / "error.log"
    assert r.returncode == 1, out[-3000:]
    assert "rollout 0 |" in r.stdout and "rollout 1 |" not in r.stdout  # it died in rollout 1, as planned
    head = "train.py: error: actor trainer rank 0 (TrainerActor, pid "
    assert r.stderr.count(head) == 1, out[-3000:]
    block = r.stderr[r.stderr.index(head):]
    lines = block.rstrip("\n").splitlines()
    assert len(lines) == 3, block
    assert ", node 127.0.0.1) died during TrainerGroup.train_step" in lines[0], block
    assert "it was killed (SIGKILL; the kernel's OOM killer" in lines[1] and "dmesg" in lines[1], block
    assert lines[2] == f"  details: {log}", block
    # nothing else says it: no Ray traceback, no raylet notice, no second report of the same death
    for noise in ("Traceback", "(raylet)", "A worker died or was killed", "ActorDiedError", "Unhandled error"):
        assert noise not in out, (noise, out[-3000:])
    text = log.read_text()
    assert "ActorDiedError" in text and "Traceback (most recent call last)" in text


def test_raylet_death_notices_go_to_the_current_runs_log(tmp_path, monkeypatch, capsys):
    """Ray's driver-side printer, wrapped once per process: each run's notices go to its own error.log (a driver
    may run several runs, as the tests do), any other raylet message still prints."""
    import ray._private.worker as ray_worker

    from slime_like.ray.failures import divert_worker_death_notices

    monkeypatch.setattr(ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream)  # restored afterwards
    divert_worker_death_notices(str(tmp_path / "first"))
    divert_worker_death_notices(str(tmp_path / "second"))
    death = "A worker died or was killed while executing a task by an unexpected system error. Worker PID: 7"
    ray_worker.print_to_stdstream({"lines": [death], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    ray_worker.print_to_stdstream({"lines": ["the node is low on disk"], "pid": "raylet", "is_err": False},
                                  ignore_prefix=False)
    printed = capsys.readouterr().out
    assert "low on disk" in printed and "A worker died" not in printed
    assert (tmp_path / "second" / "error.log").read_text() == f"(raylet) {death}\n"
    assert not (tmp_path / "first").exists()

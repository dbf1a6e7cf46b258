"""An engine killed (kill -9) while the weight push to it is in flight: two CPU engines under Ray, train.py, the
kill fired from trainer rank 0 the moment it opens the push's first request to engine 0 (after rollout 1's training).
With --use-fault-tolerance the push completes for the live engine, the killed one is restarted and given the current
weights in the same update, and the run goes on with two engines; without the flag the run stops with an error
naming the engine and the flag."""
import time

import pytest

import train
from conftest import loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow



def _argv(tiny_ckpt, prompts, run_dir, colocate: bool, fault: str, *extra):
    layout = ["--colocate", "--actor-num-gpus-per-node", "2"] if colocate else ["--actor-num-gpus-per-node", "1"]
    # one tensor per bucket: the push is many requests, so the fault lands while it is under way
    return loop_argv(tiny_ckpt, prompts, run_dir, *layout, "--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine",
                     "1", "--num-rollout", "3", "--rollout-health-check-interval", "0.5",
                     "--rollout-health-check-timeout", "2", "--update-weight-buffer-size", "1",
                     "--custom-megatron-before-train-step-hook-path", f"engine_faults.{fault}", *extra)


@pytest.mark.parametrize("colocate, fault", [(False, "kill_an_engine_during_the_push"),
                                             (True, "kill_an_engine_during_the_push"),
                                             (False, "stop_an_engine_during_the_push")],
                         ids=["disaggregated-kill", "colocated-kill", "disaggregated-sigstop"])
def test_engine_lost_during_the_push_is_restarted_on_current_weights(tiny_ckpt, toy_prompts, tmp_path, colocate,
                                                                      fault):
    t = time.perf_counter()
    assert train.main(_argv(tiny_ckpt, toy_prompts[0], tmp_path, colocate, fault, "--use-fault-tolerance")) == 0
    assert time.perf_counter() - t < 120   # a hung engine is killed by the health checks, not waited on (600 s)
    rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    # the push after rollout 1 lost engine 0 mid-way, restarted it and pushed again
    assert rows[1]["rollout/engine_restarts"] == 1 and rows[1]["weights/push_retries"] == 1, rows[1]
    # rollout 2: two engines answering, every sample's log-probs the trainer's (the restarted engine and the
    # survivor, whose first push was cut off, both hold the current weights)
    r = rows[2]
    assert r["rollout/engines_live"] == 2 and r["rollout/engines_answering"] == 2, r
    assert "rollout/dead_engines" not in r and r["rollout/logprob_abs_diff"] < 1e-3, r


def test_without_the_flag_the_run_stops_naming_the_engine(tiny_ckpt, toy_prompts, tmp_path, capsys):
    t = time.perf_counter()
    assert train.main(_argv(tiny_ckpt, toy_prompts[0], tmp_path, False, "kill_an_engine_during_the_push")) != 0
    err = capsys.readouterr().err
    assert "--use-fault-tolerance" in err and "during the weight push" in err, err
    assert time.perf_counter() - t < 120   # an error, not a wait on the dead engine

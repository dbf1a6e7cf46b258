"""--use-fault-tolerance for real: two CPU engines under Ray, one killed (kill -9) or hung (SIGSTOP past
--rollout-health-check-timeout) in the middle of rollout 1. The rollout finishes on the other engine, the
failed one is restarted at the next weight update and given the trainer's weights before it serves again.
The SIGSTOP run also kills an engine while rollout 2 is being trained on (no rollout running: the health check
before the push finds it) and, in rollout 3, an engine's Ray actor (a new actor takes its slot)."""
import json

import pytest

import train
from conftest import loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow

KILL_WHILE_TRAINING = ["--custom-megatron-before-train-step-hook-path", "engine_faults.kill_an_engine_while_training"]


def _run(tiny_ckpt, prompts, run_dir, fault: str, num_rollout: int, *extra):
    argv = loop_argv(tiny_ckpt, prompts, run_dir, "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "2",
                     "--rollout-num-gpus-per-engine", "1", "--num-rollout", str(num_rollout),
                     "--custom-generate-function-path", f"engine_faults.{fault}", "--use-fault-tolerance",
                     "--rollout-health-check-interval", "0.5", "--rollout-health-check-timeout", "2",
                     "--save-debug-rollout-data", str(run_dir / "rollout_{rollout_id}.json"), *extra)
    assert train.main(argv) == 0
    rows = [r for r in read_metrics(str(run_dir / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in rows] == list(range(num_rollout))
    return rows


def _labels_trained_on(run_dir, rollout_id):
    with open(run_dir / f"rollout_{rollout_id}.json") as f:
        return sorted(int(s["label"]) for s in json.load(f)["samples"])


@pytest.mark.parametrize("fault, extra", [("kill_engine0", []), ("stop_engine1", KILL_WHILE_TRAINING)])
def test_failed_engine_is_restarted_on_current_weights(tiny_ckpt, toy_prompts, tmp_path, fault, extra):
    n = 6 if extra else 4
    rows = _run(tiny_ckpt, toy_prompts[0], tmp_path, fault, n, *extra)
    # rollout 1 lost an engine mid-way and finished on the other; the update after it restarted that engine
    assert rows[1]["rollout/dead_engines"] == 1 and rows[1]["rollout/engines_live"] == 1, rows[1]
    assert rows[1]["rollout/engine_restarts"] == 1, rows[1]
    healthy = rows[2:]
    if extra:  # killed while rollout 2 was trained on: rollout 2 saw two engines, the update after it restarted one
        assert rows[2]["rollout/engines_live"] == 2 and rows[2]["rollout/engine_restarts"] == 1, rows[2]
        # rollout 3 lost an engine together with its Ray actor; a new actor on that slot started it again
        assert rows[3]["rollout/dead_engines"] == 1 and rows[3]["rollout/engine_restarts"] == 1, rows[3]
        healthy = rows[2:3] + rows[4:]
    for r in healthy:
        # two engines again, both answering, and every sample's log-probs are the trainer's: the restarted
        # engine got the current weights (it started from --hf-checkpoint's; left there, the gap is ~0.17)
        assert r["rollout/engines_live"] == 2 and r["rollout/engines_answering"] == 2, r
        assert "rollout/dead_engines" not in r, r
        assert r["rollout/logprob_abs_diff"] < 1e-3, r
    assert "rollout/engine_restarts" not in rows[-1] and "rollout/engine_restarts" not in rows[0]
    # exactly the scheduled prompts were trained on: rollout k holds prompts 8k..8k+7, each 8 times
    for k in range(n):
        assert _labels_trained_on(tmp_path, k) == sorted(list(range(8 * k, 8 * k + 8)) * 8), k

"""slime's debug split: generate and save rollouts without training, then train on them without engines;
and a run that talks to engines it did not start (--rollout-external-engine-addrs)."""
import pytest

import train
from conftest import loop_argv
from slime_like.utils.json_dump import read_json
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_saved_rollouts_replay_to_the_same_update(tiny_ckpt, toy_prompts, tmp_path):
    """Run A generates and trains, saving each rollout, each training batch and each step's grad norm; run B
    trains on A's saved rollouts without engines and must make the same updates (--ci-load-grad-norm checks
    every step; the logged losses agree). Run C only generates, from --start-rollout-id 1."""
    data = str(tmp_path / "debug" / "rollout_{rollout_id}.pt")
    grad_norms = str(tmp_path / "grad_norm_{role}_{rollout_id}_{step_id}")
    common = ("--colocate", "--actor-num-gpus-per-node", "1", "--num-rollout", "2")
    a = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path / "a", *common)
    assert train.main([*a, "--save-debug-rollout-data", data, "--ci-save-grad-norm", grad_norms, "--ci-test",
                       "--save-debug-train-data", str(tmp_path / "train_{rollout_id}.json"),
                       "--log-multi-turn", "--log-correct-samples"]) == 0
    run_a = [r for r in read_metrics(str(tmp_path / "a" / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert all("multi_turn/raw_response_length/response_length_mean" in r and "correct/num_samples" in r
               for r in run_a)
    with open(str(tmp_path / "debug" / "rollout_1.pt")) as f:
        assert f.read(1) == "{"                                     # JSON, whatever the name says
    train_dump = read_json(str(tmp_path / "train_1.json"))
    assert train_dump["rollout_id"] == 1 and {"tokens", "advantages"} <= set(train_dump["dp_shards"][0])

    b = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path / "b", *common)
    assert train.main([*b, "--load-debug-rollout-data", data, "--ci-load-grad-norm", grad_norms]) == 0
    run_b = [r for r in read_metrics(str(tmp_path / "b" / "metrics.jsonl")) if r["rollout_id"] >= 0]
    for key in ("rollout/reward", "actor/loss", "actor/grad_norm"):
        assert [r[key] for r in run_b] == pytest.approx([r[key] for r in run_a], rel=1e-6), key
    assert all(r["actor/grad_norm"] > 0 for r in run_b)

    c = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path / "c", "--colocate", "--actor-num-gpus-per-node", "1",
                  "--num-rollout", "2", "--start-rollout-id", "1")
    assert train.main([*c, "--debug-rollout-only"]) == 0
    run_c = [r for r in read_metrics(str(tmp_path / "c" / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in run_c] == [1] and "actor/loss" not in run_c[0]


def test_external_engine(tiny_ckpt, toy_prompts, tmp_path):
    from slime_like.args import parse_args
    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.utils.net import free_port

    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--actor-num-gpus-per-node", "1", "--num-rollout", "2")
    port = free_port()
    engine = start_engine(parse_args([*argv, "--rollout-num-gpus", "1"], exit_on_error=False), kind="cpu",
                          port=port, log_dir=str(tmp_path))
    try:
        assert train.main([*argv, "--rollout-external-engine-addrs", f"127.0.0.1:{port}"]) == 0
        rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
        # weights were pushed into the external engine, which then generated with them
        assert len(rows) == 2 and all(r["weights/bytes_sent"] > 0 and r["rollout/logprob_abs_diff"] < 1e-3
                                      for r in rows)
        assert engine.alive()  # not ours to stop
    finally:
        engine.stop()


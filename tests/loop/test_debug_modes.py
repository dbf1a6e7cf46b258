"""slime's debug split: generate and save rollouts without training, then train on them without engines;
and a run that talks to engines it did not start (--rollout-external-engine-addrs)."""
import pytest

import train
from conftest import loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_rollout_only_then_train_only_on_the_saved_rollouts(tiny_ckpt, toy_prompts, tmp_path):
    data = str(tmp_path / "debug" / "rollout_{rollout_id}.pt")
    gen_dir, train_dir = tmp_path / "gen", tmp_path / "train"
    base = loop_argv(tiny_ckpt, toy_prompts[0], gen_dir, "--colocate", "--actor-num-gpus-per-node", "1",
                     "--num-rollout", "2")
    assert train.main([*base, "--debug-rollout-only", "--save-debug-rollout-data", data, "--log-multi-turn",
                       "--log-correct-samples"]) == 0
    gen = [r for r in read_metrics(str(gen_dir / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert len(gen) == 2 and all("rollout/reward" in r and "actor/loss" not in r for r in gen)
    assert all("multi_turn/raw_response_length/response_length_mean" in r and "correct/num_samples" in r
               for r in gen)

    base = loop_argv(tiny_ckpt, toy_prompts[0], train_dir, "--colocate", "--actor-num-gpus-per-node", "1",
                     "--num-rollout", "2")
    # --start-rollout-id 1: the loop starts at rollout 1 (no checkpoint), so only the second saved rollout trains
    assert train.main([*base, "--debug-train-only", "--load-debug-rollout-data", data, "--start-rollout-id", "1"]) == 0
    trained = [r for r in read_metrics(str(train_dir / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in trained] == [1] and trained[0]["actor/grad_norm"] > 0
    # the trainer saw exactly the saved rollout
    assert trained[0]["rollout/reward"] == gen[1]["rollout/reward"]


def test_external_engine(tiny_ckpt, toy_prompts, tmp_path):
    from slime_like.args import parse_args
    from slime_like.backends.sglang.launcher import start_engine
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


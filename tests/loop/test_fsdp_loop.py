"""`--train-backend fsdp` through the whole loop: Ray, the CPU engine over HTTP, FSDP2 training, weight sync."""
import pytest

import train
from conftest import loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def _rollouts(run_dir):
    return [r for r in read_metrics(str(run_dir / "metrics.jsonl")) if r["rollout_id"] >= 0]


def _mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def test_fsdp_colocated_grpo_learns_and_engines_match_the_trainer(tiny_ckpt, toy_prompts, tmp_path):
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--train-backend", "fsdp", "--colocate",
                     "--actor-num-gpus-per-node", "1", "--num-rollout", "8")
    assert train.main(argv) == 0
    rows = _rollouts(tmp_path)
    assert [r["rollout_id"] for r in rows] == list(range(8))
    first, last = _mean(rows[:2], "rollout/reward"), _mean(rows[-2:], "rollout/reward")
    assert last > first + 0.15, (first, last)
    for r in rows:  # every push reached the engine: it generates with exactly the trainer's weights
        assert r["rollout/logprob_abs_diff"] < 1e-3, r


def test_fsdp_lora_two_ranks_disaggregated_syncs_merged_weights(tiny_ckpt, toy_prompts, tmp_path):
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--train-backend", "fsdp", "--actor-num-gpus-per-node", "2",
                     "--rollout-num-gpus", "1", "--num-rollout", "2", "--lora-rank", "8", "--lora-alpha", "16",
                     "--micro-batch-size", "32")
    assert train.main(argv) == 0
    rows = _rollouts(tmp_path)
    assert len(rows) == 2
    for r in rows:  # merged LoRA weights broadcast over gloo; the engine scores like the sharded trainer
        assert r["weights/bytes_sent"] > 0 and r["rollout/logprob_abs_diff"] < 1e-3, r
    assert rows[-1]["actor/grad_norm"] > 0


def test_fsdp_lora_delta_weight_sync_sends_only_the_adapted_weights(tiny_ckpt, toy_prompts, tmp_path):
    """LoRA on q_proj / v_proj with --update-weight-mode delta: each push writes the merged weights that changed
    (a fraction of the model), and the engine still scores exactly like the trainer."""
    from slime_like.backends.engine_api import disk_delta

    full = sum(raw.size for _, _, raw in disk_delta.read_checkpoint(tiny_ckpt).values())
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--train-backend", "fsdp", "--actor-num-gpus-per-node", "1",
                     "--rollout-num-gpus", "1", "--num-rollout", "2", "--lora-rank", "8", "--lora-alpha", "16",
                     "--lora-target-modules", "q_proj", "v_proj", "--update-weight-mode", "delta",
                     "--update-weight-transport", "disk", "--update-weight-disk-dir", str(tmp_path / "deltas"),
                     "--update-weight-local-checkpoint-dir", str(tmp_path / "engine_local"))
    assert train.main(argv) == 0
    rows = _rollouts(tmp_path)
    assert len(rows) == 2
    print(f"\nfull weights {full} bytes; delta pushes wrote {[r['weights/bytes_sent'] for r in rows]} bytes")
    for r in rows:
        assert r["rollout/logprob_abs_diff"] < 1e-3, r
        assert 0 < r["weights/bytes_sent"] < 0.3 * full, (r["weights/bytes_sent"], full)


def test_fsdp_ulysses_sequence_parallel_scores_like_the_engine(tiny_ckpt, toy_prompts, tmp_path):
    """--context-parallel-size 2 with fsdp (Ulysses, backends/fsdp/ulysses.py): both ranks of the one data-parallel
    rank get the whole batch, score it half a sequence each, and rank 0 pushes the weights: the engine's log-probs
    equal the trainer's before and after each push."""
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--train-backend", "fsdp", "--actor-num-gpus-per-node", "2",
                     "--context-parallel-size", "2", "--rollout-num-gpus", "1", "--num-rollout", "2")
    assert train.main(argv) == 0
    rows = _rollouts(tmp_path)
    assert len(rows) == 2
    for r in rows:
        assert r["weights/bytes_sent"] > 0 and r["rollout/logprob_abs_diff"] < 1e-3, r
    assert rows[-1]["actor/grad_norm"] > 0

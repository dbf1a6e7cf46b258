"""On-policy distillation on the demo task, for real (train.py, Ray, CPU engine, megatron-core), against GRPO.

The student is the demo's SFT warm-up; the teacher is the same base model SFT'd further (prepare
--teacher-target). Pure distillation (zero task reward, --opd-kl-mode full, one sample for each of 512 prompts)
and the demo's GRPO (64 prompts x 8 samples) start from the same checkpoint and spend the same 512 samples per
rollout; after 60 rollouts the distilled student must be far ahead. docs/demo.md has the long runs (the student
reaching close to the teacher); this is their short, asserted version.
"""
import pytest

import train
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow
ROLLOUTS = 60


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from slime_like.demo.prepare import prepare

    return prepare(str(tmp_path_factory.mktemp("opd_task")), teacher_target=0.6, log=lambda *a: None)


def _demo_argv(task, run_dir, *extra):
    """scripts/run-demo.sh's flags (held-out greedy eval every 10 rollouts), for ROLLOUTS rollouts."""
    return ["--hf-checkpoint", task["sft_model"], "--prompt-data", task["train"], "--input-key", "prompt",
            "--label-key", "label", "--rollout-shuffle", "--custom-rm-path", "slime_like.demo.arith.reward",
            "--num-rollout", str(ROLLOUTS), "--rollout-max-response-len", "5", "--rollout-temperature", "1",
            "--advantage-estimator", "grpo", "--clip-grad", "1.0", "--micro-batch-size", "128",
            "--eval-prompt-data", "arith", task["heldout"], "--eval-interval", "10",
            "--n-samples-per-eval-prompt", "1", "--eval-temperature", "0", "--eval-max-response-len", "5",
            "--colocate", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
            "--run-dir", str(run_dir), *extra]


def _accuracy(run_dir) -> list[float]:
    records = read_metrics(str(run_dir / "metrics.jsonl"))
    return [r["eval/arith/accuracy"] for r in records if "eval/arith/accuracy" in r]


def test_distillation_learns_far_faster_than_grpo(task, tmp_path):
    distill = ["--rollout-batch-size", "512", "--n-samples-per-prompt", "1", "--lr", "1e-3", "--lr-warmup-iters", "10",
               "--lr-decay-style", "constant", "--use-opd", "--opd-type", "megatron", "--opd-teacher-load",
               task["teacher_model"], "--opd-kl-mode", "full",
               "--custom-reward-post-process-path", "slime_like.demo.arith.distill_only_rewards"]
    grpo = ["--rollout-batch-size", "64", "--n-samples-per-prompt", "8", "--lr", "2e-4", "--lr-decay-style", "cosine",
            "--min-lr", "5e-5"]
    assert train.main(_demo_argv(task, tmp_path / "opd", *distill)) == 0
    assert train.main(_demo_argv(task, tmp_path / "grpo", *grpo)) == 0
    opd, rl = _accuracy(tmp_path / "opd"), _accuracy(tmp_path / "grpo")
    assert len(opd) == len(rl) == ROLLOUTS // 10 + 1 and opd[0] == rl[0]  # the same start, greedy
    # rollouts 40, 50, 60 (one eval of 200 prompts has a standard error of ~3 points). Measured here: distilled
    # 0.38-0.41 from 0.15 (teacher 0.61), GRPO 0.23
    late = lambda curve: sum(curve[-3:]) / 3  # noqa: E731
    teacher = task["teacher"]["heldout_accuracy"]
    assert late(opd) >= opd[0] + 0.15, (opd, rl, teacher)
    assert late(opd) >= late(rl) + 0.06, (opd, rl, teacher)

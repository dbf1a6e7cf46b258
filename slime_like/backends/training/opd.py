"""On-policy distillation in the trainers' advantage pass (--use-opd; docs/guide.md "On-policy distillation").

Both trainer backends' advantage pass (advantages.py) calls `apply_opd` after the estimator (or
--custom-advantage-function-path) and before whitening, as slime does. The teacher's per-token log-probs reach
the batch either from the actor's frozen teacher model (--opd-type megatron, `teacher_log_probs` of
compute_log_probs) or from the rollout (--opd-type sglang: `sample.teacher_log_probs`, set by the teacher-scoring
reward post-process).
"""
from __future__ import annotations

import torch

from slime_like import algorithms as alg
from slime_like.backends.training import data as D


def student_key(args) -> str:
    """The student's scoring log-probs: the trainer's old-policy pass, or the engine's with --use-rollout-logprobs."""
    return "rollout_log_probs" if args.use_rollout_logprobs else "log_probs"


def apply_opd(args, batch: dict, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """advantages - --opd-kl-coef x (student - teacher log-prob), per token; padded [n, R] in and out."""
    if "teacher_log_probs" not in batch:
        how = ("the actor's teacher model (--opd-teacher-load) did not score it" if args.opd_type == "megatron" else
               "the rollout set no sample.teacher_log_probs: use --custom-rm-path "
               "slime_like.rollout.on_policy_distillation.reward_func --custom-reward-post-process-path "
               "slime_like.rollout.on_policy_distillation.post_process_rewards --rm-url http://TEACHER/generate")
        raise ValueError(f"--use-opd --opd-type {args.opd_type}: the batch has no teacher_log_probs; {how}")
    key = student_key(args)
    D.validate_batch(batch, (key, "teacher_log_probs"))
    width = adv.shape[1]
    student = D.pad_rows(batch[key], width).to(adv.dtype)
    teacher = D.pad_rows(batch["teacher_log_probs"], width).to(adv.dtype)
    adjusted, _ = alg.opd_advantages(adv, student, teacher, mask, float(args.opd_kl_coef))
    return adjusted

"""On-policy distillation (slime's add_on_policy_distillation_arguments): flags and slime's rules.

--use-opd needs --opd-type; megatron needs --opd-teacher-load (a directory); sglang must not have one; a
teacher path without --use-opd is an error (it would be ignored). What each type does: docs/guide.md.
"""
from __future__ import annotations

import os

from slime_like.config.errors import ConfigError
from slime_like.config.types import Float, Int


def add_opd_flags(g):
    """(slime extras group)"""
    a = g.add_argument
    a("--use-opd", action="store_true", default=False,
      help="On-policy distillation: a teacher scores the student's samples; advantages -= coef x (student - "
           "teacher log-prob). Needs --opd-type.")
    a("--opd-type", default=None, choices=["sglang", "megatron"],
      help="sglang: teacher log-probs from a teacher engine during the rollout (--rm-url, the reward function "
           "slime.rollout.on_policy_distillation.reward_func); megatron: a frozen teacher model in the trainer "
           "(--opd-teacher-load).")
    a("--opd-kl-coef", type=Float(0), default=1.0,
      help="Weight of the OPD reverse-KL term (in the advantages, or in the loss with --opd-kl-mode full).")
    a("--opd-kl-mode", default="sampled", choices=["sampled", "full"],
      help="sampled (slime's): the sampled token's student - teacher log-prob, subtracted from its advantage; "
           "full (ours): the exact reverse KL over the whole vocabulary at every response position, a loss term "
           "computed against the teacher model on each micro-batch (--opd-type megatron, one pipeline stage).")
    a("--opd-teacher-load", default=None,
      help="Teacher checkpoint for --opd-type megatron (torch_dist; an HF directory also works here).")
    a("--opd-teacher-ckpt-step", type=Int(0), default=None,
      help="Iteration of --opd-teacher-load to load (default: latest).")


def validate_opd(args, report) -> None:
    """slime's rules; a missing teacher path is collected as a path problem (reported with the others)."""
    if not args.use_opd:
        if args.opd_teacher_load is not None:
            raise ConfigError(f"--opd-teacher-load {args.opd_teacher_load} is set but --use-opd is not: add --use-opd "
                              "--opd-type megatron, or drop --opd-teacher-load")
        if args.opd_type is not None:
            raise ConfigError(f"--opd-type {args.opd_type} is set but --use-opd is not: add --use-opd")
        if args.opd_kl_mode != "sampled":
            raise ConfigError(f"--opd-kl-mode {args.opd_kl_mode} is set but --use-opd is not: add --use-opd")
        return
    if args.opd_type is None:
        raise ConfigError("--use-opd needs --opd-type: 'megatron' (a teacher model in the trainer, "
                          "--opd-teacher-load DIR) or 'sglang' (a teacher engine scores the samples during the "
                          "rollout, --rm-url)")
    if not args.compute_advantages_and_returns:
        raise ConfigError("--use-opd with --disable-compute-advantages-and-returns: the OPD term is applied to the "
                          "advantages; drop one of them")
    if args.opd_kl_coef < 0:
        raise ConfigError(f"--opd-kl-coef {args.opd_kl_coef}: must be >= 0 (it weighs a penalty)")
    if args.opd_type == "megatron":
        if args.opd_teacher_load is None:
            raise ConfigError("--opd-type megatron needs --opd-teacher-load DIR: the teacher's Megatron checkpoint "
                              "(torch_dist, e.g. from tools/convert_hf_to_torch_dist.py) or an HF directory")
        if not os.path.exists(args.opd_teacher_load):
            report.path_problem(f"--opd-teacher-load {args.opd_teacher_load}: no such file or directory (the OPD "
                                "teacher)")
    else:
        if args.opd_teacher_load is not None:
            raise ConfigError(f"--opd-teacher-load {args.opd_teacher_load} with --opd-type sglang: the teacher's "
                              "log-probs come from its engine during the rollout (--rm-url); drop --opd-teacher-load "
                              "or use --opd-type megatron")
        if args.opd_teacher_ckpt_step is not None:
            raise ConfigError("--opd-teacher-ckpt-step selects an iteration of --opd-teacher-load (--opd-type "
                              "megatron); drop it with --opd-type sglang")
        rm = args.custom_rm_path or ""
        if rm.endswith("on_policy_distillation.reward_func") and not args.rm_url:
            raise ConfigError(f"--opd-type sglang with --custom-rm-path {rm} needs --rm-url "
                              "http://TEACHER:PORT/generate (the teacher engine that scores the student's tokens)")
        if not rm.endswith("on_policy_distillation.reward_func"):
            report.warn("--opd-type sglang: the samples need the teacher's log-probs; slime's recipe gets them with "
                        "--custom-rm-path slime.rollout.on_policy_distillation.reward_func "
                        "--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards "
                        "--rm-url http://TEACHER/generate; otherwise your functions must set sample.teacher_log_probs (training stops at the first "
                        "rollout without them)")
    if args.opd_kl_mode == "full":
        _validate_full_kl(args)


def _validate_full_kl(args) -> None:
    """--opd-kl-mode full: the teacher's whole distribution at each position, in the policy loss."""
    if args.opd_type != "megatron":
        raise ConfigError(f"--opd-kl-mode full with --opd-type {args.opd_type}: the full-vocabulary KL needs the "
                          "teacher's whole distribution at every position, which only a teacher model in the trainer "
                          "gives (--opd-type megatron --opd-teacher-load DIR); a teacher engine returns one log-prob "
                          "per token: use --opd-kl-mode sampled with it")
    if args.loss_type != "policy_loss":
        raise ConfigError(f"--opd-kl-mode full with --loss-type {args.loss_type}: the KL term is added to the policy "
                          "loss; use --loss-type policy_loss, or --opd-kl-mode sampled (it acts on the advantages "
                          "your loss reads)")
    if args.pipeline_model_parallel_size > 1:
        raise ConfigError(f"--opd-kl-mode full with --pipeline-model-parallel-size "
                          f"{args.pipeline_model_parallel_size}: the teacher runs inside the actor's loss on one "
                          "pipeline stage; use --pipeline-model-parallel-size 1 (tensor / data parallelism are fine), "
                          "or --opd-kl-mode sampled")

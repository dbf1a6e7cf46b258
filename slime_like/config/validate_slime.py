"""slime feature flags checked by validate.validate_args: on-policy distillation (slime's rules,
slime/utils/arguments.py), --check-weight-update-equal and --load-forge-rollout-data.

--use-opd needs --opd-type; megatron needs --opd-teacher-load (a directory); sglang must not have one; a
teacher path without --use-opd is an error (it would be ignored). What each type does: docs/guide.md.
"""
from __future__ import annotations

import os

from slime_like.config.errors import ConfigError, warn


def validate_slime_features(args, path_problem) -> None:
    validate_opd(args, path_problem)
    _forge(args, path_problem)
    if args.keep_old_actor and args.train_backend != "megatron":
        args.launch_refusals.append(f"--keep-old-actor with --train-backend {args.train_backend}: only the Megatron "
                                    "trainer keeps the pushed weights; use --train-backend megatron")
    if args.keep_old_actor and args.use_rollout_logprobs:
        raise ConfigError("--keep-old-actor scores the old policy with the pushed weights, --use-rollout-logprobs "
                          "takes the engine's log-probs as the old policy instead: use one of them")
    if args.check_weight_update_equal and args.rollout_engine == "vllm":
        args.launch_refusals.append("--check-weight-update-equal with --rollout-engine vllm: the vLLM adapter has no "
                                    "/weights_checker route (SGLang and the CPU engine have it)")
    if args.check_weight_update_equal and args.rollout_external_engine_addrs:
        args.launch_refusals.append("--check-weight-update-equal with --rollout-external-engine-addrs: the check "
                                    "overwrites the engines' weights with noise before the first push; run it on "
                                    "engines the run starts itself")


def _forge(args, path_problem) -> None:
    """--load-forge-rollout-data is read only by slime's forge_load rollout function: one without the other is an
    error (the flag would be ignored, or the rollout would fail at its first call)."""
    forge = (args.rollout_function_path or "").endswith("rollout.forge_load.generate_rollout")
    if args.load_forge_rollout_data and not forge:
        raise ConfigError(f"--load-forge-rollout-data {args.load_forge_rollout_data} is read by slime's forge_load "
                          "rollout only: add --rollout-function-path slime.rollout.forge_load.generate_rollout "
                          "(or use --load-debug-rollout-data to train on dumps without engines)")
    if forge and not args.load_forge_rollout_data:
        raise ConfigError(f"--rollout-function-path {args.rollout_function_path} needs --load-forge-rollout-data PATH "
                          "(a --save-debug-rollout-data dump, or a {rollout_id} template of them)")
    path = args.load_forge_rollout_data
    if path and "{rollout_id}" not in path and not os.path.exists(path):
        path_problem(args, f"--load-forge-rollout-data {path}: no such file")


def validate_opd(args, path_problem) -> None:
    """`path_problem(args, message)` collects a missing path (validate.py reports them together)."""
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
            path_problem(args, f"--opd-teacher-load {args.opd_teacher_load}: no such file or directory (the OPD "
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
            warn(args, "--opd-type sglang: the samples need the teacher's log-probs; slime's recipe gets them with "
                       "--custom-rm-path slime.rollout.on_policy_distillation.reward_func --custom-reward-post-process-"
                       "path slime.rollout.on_policy_distillation.post_process_rewards --rm-url http://TEACHER/generate; "
                       "otherwise your functions must set sample.teacher_log_probs (training stops at the first "
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

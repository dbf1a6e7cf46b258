"""Validation and derived defaults, in slime's order: the one place that says in which order each concern's
checks run (the checks themselves live in their concern's module). Each error names the flags, their values and
the fix.

Mutates the namespace only to fill derived defaults (documented per rule in docs/configuration.md).
"""
from __future__ import annotations

from slime_like.config import (algorithm, checkpoint, cluster, data, disaggregation, distillation, engines,
                               logging_debug, model, mtp, optimizer, rewards, rollout, sparse_attention, support,
                               trainer_fsdp, trainer_megatron)
from slime_like.config.hf_config import check_model_against_hf, fill_model_from_hf
from slime_like.config.hf_vision import check_vision_language
from slime_like.registry import TRAINER_BACKENDS


def validate_args(args, report, raise_path_problems: bool = True) -> None:
    """Validate and fill derived defaults; warnings, launch refusals and missing paths go to `report` (a
    ConfigReport), never onto `args`. Missing input paths are independent of every other rule: they are
    collected and raised together at the end, or (raise_path_problems=False) left to the preflight, which
    checks the same paths more deeply and reports them with its own findings in one message."""
    support.check_flag_support(args, report)  # accepted-but-not-honoured flags, on raw values
    support.check_role_overrides_support(args, report)
    data.check_required(args)
    data.check_batch_identity(args)
    algorithm.check_algorithm(args, report)
    engines.check_weight_transport(args, report)
    rollout.check_generation_limits(args, report)
    algorithm.check_loss_shaping(args)
    rewards.check_reward_scale(args)
    optimizer.check_stateless_adam(args)
    algorithm.check_per_token_loss(args)
    data.apply_prompt_template(args)
    distillation.validate_opd(args, report)
    rollout.check_forge(args, report)
    rollout.check_data_transport(args, report)
    trainer_megatron.check_keep_old_actor(args, report)
    engines.check_weight_update_check(args, report)
    _rollout_and_eval(args, report)
    checkpoint.check_checkpoints(args, report)
    model.check_vision_tower(args)
    TRAINER_BACKENDS.run_validator(args.train_backend, args, report)  # the backend's own checks (registry.py)
    trainer_fsdp.check_lora(args, report)
    logging_debug.check_debug(args)
    trainer_megatron.check_precision(args, cluster.cuda_visible())
    trainer_megatron.check_fp8(args, report, cluster.cuda_visible())
    fill_model_from_hf(args)
    model.derive_model_defaults(args, report)
    cluster.validate_cluster(args, report)
    engines.check_engine_passthrough(args, report)  # needs the resolved --rollout-engine
    engines.check_router_flags(args, report)
    disaggregation.check_disaggregation(args, report)  # needs --rollout-num-gpus and the engine resolved
    engines.check_engine_limits(args, report, cluster.cuda_visible())
    data.check_multimodal_engine(args)
    check_model_against_hf(args)
    mtp.check_mtp_training(args, report)  # needs the parallel sizes and config.json
    sparse_attention.check(args, report)  # slime's glm5 spec and --allgather-cp (CP > 1) name DSA models only
    if TRAINER_BACKENDS.has(args.train_backend, "megatron_core_spec"):  # the HF tower inside megatron-core
        check_vision_language(args)
    model.check_routing_replay(args)      # needs the model's MoE fields (config.json fills them)
    trainer_megatron.check_shared_prompt(args)  # needs the parallel sizes and the model type
    logging_debug.derive_run_dirs(args)
    engines.derive_external(args)
    if raise_path_problems:
        report.raise_path_problems()


def _rollout_and_eval(args, report):
    rollout.check_sampling(args)
    eval_data = data.eval_data(args, report)
    if not args.debug_train_only:
        data.check_data_paths(args, report, eval_data)
    data.check_eval_schedule(args, eval_data)
    data.check_multimodal(args)
    rewards.check_rewards_and_tools(args)
    rollout.check_fully_async(args, report)
    rollout.check_partial_rollout(args, report)
    data.num_rollout_from_epochs(args, report)

"""Validation and derived defaults, in slime's order. Each error names the flags, their values and the fix.

Mutates the namespace only to fill derived defaults (documented per rule in docs/configuration.md).
"""
from __future__ import annotations

import os
import time

from slime_like.config.errors import ConfigError, warn
from slime_like.config.flags_algo import ESTIMATOR_TRAITS, reference_needed
from slime_like.config.validate_fsdp import validate_fsdp
from slime_like.config.slime_paths import is_fully_async
from slime_like.config.hf_config import check_model_against_hf, fill_model_from_hf
from slime_like.config.support import (check_engine_passthrough, check_flag_support, check_role_overrides_support,
                                       check_router_flags)
from slime_like.config.validate_cluster import validate_cluster
from slime_like.config.validate_extras import validate_extras
from slime_like.config.validate_slime import validate_slime_features
from slime_like.config.eval_config import read_eval_config


def validate_args(args, raise_path_problems: bool = True) -> None:
    """Validate and fill derived defaults. Missing input paths are independent of every other rule: they are
    collected and raised together at the end, or (raise_path_problems=False) left to the preflight, which
    checks the same paths more deeply and reports them with its own findings in one message."""
    args.config_path_problems = []
    check_flag_support(args)  # accepted-but-not-honoured flags: error or warning (support.py), on raw values
    check_role_overrides_support(args)
    _require(args)
    _batch_identity(args)
    _algorithm(args)
    validate_extras(args)
    validate_slime_features(args, _path_problem)
    _rollout_and_eval(args)
    _checkpoints(args)
    validate_fsdp(args)
    _debug(args)
    fill_model_from_hf(args)
    _model(args)
    validate_cluster(args)
    check_engine_passthrough(args)  # needs the resolved --rollout-engine
    check_router_flags(args)
    check_model_against_hf(args)
    _misc_defaults(args)
    problems = args.config_path_problems
    if problems and raise_path_problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))


def _path_problem(args, message: str) -> None:
    args.config_path_problems.append(message)


def _require(args):
    if args.rollout_batch_size is None:
        raise ConfigError("--rollout-batch-size is required (prompts per rollout), e.g. --rollout-batch-size 32")
    for flag in ("rollout_batch_size", "n_samples_per_prompt", "micro_batch_size", "update_weights_interval"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.start_rollout_id is not None and args.start_rollout_id < 0:
        raise ConfigError(f"--start-rollout-id must be >= 0, got {args.start_rollout_id} (leave it unset to resume "
                          "from the --load checkpoint)")
    if args.num_rollout is None and args.num_epoch is None:
        raise ConfigError("set --num-rollout N (rollouts to run) or --num-epoch N (passes over --prompt-data)")


def _batch_identity(args):
    """Seed 004: rollout_batch_size * n_samples_per_prompt == global_batch_size * num_steps_per_rollout."""
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    gbs, steps = args.global_batch_size, args.num_steps_per_rollout
    rule = (f"--rollout-batch-size {args.rollout_batch_size} x --n-samples-per-prompt {args.n_samples_per_prompt} "
            f"= {samples} samples per rollout")
    if steps is not None and steps < 1 or gbs is not None and gbs < 1:
        raise ConfigError(f"--global-batch-size ({gbs}) and --num-steps-per-rollout ({steps}) must be >= 1")
    if steps is None and gbs is None:
        steps, gbs = 1, samples
    elif steps is None:
        if samples % gbs:
            raise ConfigError(f"{rule} is not a multiple of --global-batch-size {gbs}; choose a divisor of {samples} "
                              "or set --num-steps-per-rollout instead")
        steps = samples // gbs
    elif gbs is None:
        if samples % steps:
            raise ConfigError(f"{rule} does not split into --num-steps-per-rollout {steps} equal steps; "
                              f"choose a divisor of {samples}")
        gbs = samples // steps
    elif gbs * steps != samples:
        raise ConfigError(f"{rule}, but --global-batch-size {gbs} x --num-steps-per-rollout {steps} = {gbs * steps}; "
                          "they must be equal (drop one of the two flags to derive it)")
    args.global_batch_size, args.num_steps_per_rollout = gbs, steps
    if not args.use_dynamic_batch_size and gbs % args.micro_batch_size:
        raise ConfigError(f"--global-batch-size {gbs} is not a multiple of --micro-batch-size {args.micro_batch_size}")
    if args.use_dynamic_batch_size and args.max_tokens_per_gpu is None:
        raise ConfigError("--use-dynamic-batch-size needs --max-tokens-per-gpu (the token budget per micro-batch)")
    if args.use_dynamic_batch_size and args.log_probs_max_tokens_per_gpu is None:
        args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.over_sampling_batch_size < args.rollout_batch_size:
        raise ConfigError(f"--over-sampling-batch-size {args.over_sampling_batch_size} must be >= "
                          f"--rollout-batch-size {args.rollout_batch_size}")


def _algorithm(args):
    est = args.advantage_estimator
    if not args.compute_advantages_and_returns and args.loss_type == "policy_loss":
        raise ConfigError(f"--disable-compute-advantages-and-returns with --loss-type {args.loss_type}: the policy "
                          "loss needs advantages; it is for --loss-type sft_loss or custom_loss")
    traits = ESTIMATOR_TRAITS[est]
    critic_users = [name for name, t in ESTIMATOR_TRAITS.items() if t.needs_critic]
    if args.use_critic and not traits.needs_critic:
        raise ConfigError(f"--use-critic with --advantage-estimator {est}: only {', '.join(critic_users)} use(s) "
                          f"critic values (GAE); use --advantage-estimator {critic_users[0]} or drop --use-critic")
    if traits.needs_critic and not args.use_critic:
        args.use_critic = True  # slime: the ppo estimator always trains a critic
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.eps_clip <= 0 or args.eps_clip_high <= 0:
        raise ConfigError(f"--eps-clip ({args.eps_clip}) and --eps-clip-high ({args.eps_clip_high}) must be > 0")
    if args.eps_clip_c is not None and args.eps_clip_c <= 1.0:
        raise ConfigError(f"--eps-clip-c {args.eps_clip_c}: dual-clip PPO needs c > 1 (e.g. 3.0)")
    if args.kl_coef != 0 and args.kl_loss_coef != 0:
        raise ConfigError(f"--kl-coef {args.kl_coef} (KL in the reward) and --kl-loss-coef {args.kl_loss_coef} "
                          "(KL in the loss) are both set; use one of them")
    if args.kl_coef != 0 and not traits.uses_reward_kl:
        warn(args, f"--kl-coef {args.kl_coef} has no effect with --advantage-estimator {est}: it ignores the "
                   "reward-side KL, so no reference model and no reference forward pass are run for it "
                   "(regularise with --use-kl-loss --kl-loss-coef instead)")
    # with LoRA (--train-backend fsdp) the reference is the base (--ref-load or --hf-checkpoint), adapters disabled
    lora_reference = args.train_backend == "fsdp" and args.lora_rank
    if reference_needed(args) and not lora_reference:
        if not args.ref_load:
            which = "--use-kl-loss" if args.use_kl_loss else f"--kl-coef {args.kl_coef}"
            raise ConfigError(f"{which} needs a reference model: set --ref-load to its checkpoint")
        if not os.path.exists(args.ref_load):
            _path_problem(args, f"--ref-load {args.ref_load}: no such file or directory (the KL reference model)")
    if traits.needs_normalize_advantages and not args.normalize_advantages:
        raise ConfigError(f"--advantage-estimator {est} needs --normalize-advantages (REINFORCE++ whitens "
                          "advantages over the batch); add the flag")
    if args.loss_type == "custom_loss" and not args.custom_loss_function_path:
        raise ConfigError("--loss-type custom_loss needs --custom-loss-function-path module.function")
    if args.use_rollout_logprobs and args.use_tis:
        raise ConfigError("--use-rollout-logprobs and --use-tis exclude each other: TIS corrects between rollout "
                          "and trainer log-probs, which --use-rollout-logprobs makes identical")
    if args.n_samples_per_prompt == 1 and args.grpo_std_normalization and traits.normalizes_group_std:
        args.grpo_std_normalization = False  # slime: the std of a one-sample group is undefined
        warn(args, "--n-samples-per-prompt 1: GRPO std normalisation turned off (a group of one has no std)")
    if args.num_critic_only_steps and not args.use_critic:
        raise ConfigError(f"--num-critic-only-steps {args.num_critic_only_steps} needs a critic "
                          "(--advantage-estimator ppo)")


def _rollout_and_eval(args):
    _sampling(args)
    data = _eval_data(args)
    if not args.debug_train_only:
        _data_paths(args, data)
    if args.eval_interval is not None:
        if args.eval_interval < 1:
            raise ConfigError(f"--eval-interval {args.eval_interval}: must be >= 1")
        if not data:
            raise ConfigError(f"--eval-interval {args.eval_interval} needs eval data: add --eval-prompt-data NAME PATH")
    if args.eval_function_path is None:
        args.eval_function_path = args.rollout_function_path
    if args.eval_reward_key is None:
        args.eval_reward_key = args.reward_key
    _rewards_and_tools(args)
    _fully_async(args)
    if args.partial_rollout and args.over_sampling_batch_size == args.rollout_batch_size \
            and not args.dynamic_sampling_filter_path and not is_fully_async(args):
        warn(args, "--partial-rollout without over-sampling or a dynamic sampling filter never aborts a generation, "
                   "so it has no effect")
    if args.num_epoch is not None and args.num_rollout is not None:
        warn(args, f"both --num-rollout {args.num_rollout} and --num-epoch {args.num_epoch} set; --num-epoch is "
                   "ignored (slime)")
    elif args.num_epoch is not None:
        _num_rollout_from_epochs(args)


def _sampling(args):
    """Temperatures, top-p and the context lengths (a missing prompt / eval length follows the context)."""
    if args.rollout_temperature <= 0:
        raise ConfigError(f"--rollout-temperature {args.rollout_temperature}: must be > 0 (0 is greedy decoding, "
                          "not a stochastic policy RL can learn from)")
    if args.eval_temperature is not None and args.eval_temperature < 0:
        raise ConfigError(f"--eval-temperature {args.eval_temperature}: must be >= 0")
    for flag in ("rollout_top_p", "eval_top_p"):
        v = getattr(args, flag)
        if v is not None and not 0 < v <= 1:
            raise ConfigError(f"--{flag.replace('_', '-')} {v}: must be in (0, 1]")
    if args.rollout_max_context_len is not None:
        if args.rollout_max_prompt_len is None:
            args.rollout_max_prompt_len = args.rollout_max_context_len - 1
        if args.rollout_max_prompt_len > args.rollout_max_context_len - 1:
            raise ConfigError(f"--rollout-max-prompt-len {args.rollout_max_prompt_len} must be < "
                              f"--rollout-max-context-len {args.rollout_max_context_len} (room for one new token)")
    if args.eval_max_context_len is None:
        args.eval_max_context_len = args.rollout_max_context_len


def _eval_data(args):
    """--eval-config / --eval-prompt-data as NAME PATH pairs (args.eval_prompt_data; None without eval data)."""
    args.eval_datasets = None
    if args.eval_config:  # slime: the file replaces --eval-prompt-data
        if args.eval_prompt_data:
            warn(args, f"--eval-config {args.eval_config} replaces --eval-prompt-data {' '.join(args.eval_prompt_data)}")
        args.eval_datasets = read_eval_config(args.eval_config)
        args.eval_prompt_data = [v for d in args.eval_datasets for v in (d["name"], d["path"])]
    data = args.eval_prompt_data
    if data is not None:
        if len(data) == 1:
            warn(args, f"--eval-prompt-data {data[0]}: one value given, read as dataset 'aime' (slime's legacy form); "
                       "write NAME PATH pairs")
            data = args.eval_prompt_data = ["aime", data[0]]
        if len(data) % 2:
            raise ConfigError(f"--eval-prompt-data {' '.join(data)}: expected NAME PATH pairs, got {len(data)} values")
        names = data[0::2]
        if len(set(names)) != len(names):
            raise ConfigError(f"--eval-prompt-data: dataset names must be unique, got {names}")
    return data


def _data_paths(args, eval_data):
    """The prompt and eval files exist (collected as path problems, reported together)."""
    if args.prompt_data and not os.path.exists(args.prompt_data):
        _path_problem(args, f"--prompt-data {args.prompt_data}: no such file")
    if args.prompt_data_extra and not args.prompt_data:
        raise ConfigError("--prompt-data-extra adds files after --prompt-data; give --prompt-data first")
    for path in args.prompt_data_extra or []:
        if not os.path.exists(path):
            _path_problem(args, f"--prompt-data-extra {path}: no such file")
    for name, path in zip((eval_data or [])[0::2], (eval_data or [])[1::2]):
        if not os.path.exists(path):
            _path_problem(args, f"--eval-prompt-data {name} {path}: no such file")


def _rewards_and_tools(args):
    """Reward-model timeouts and retries, the tool-call settings, reward types that cannot run here."""
    for flag, low in (("rm_timeout", 0), ("rm_retry_backoff", 0)):
        if getattr(args, flag) <= low:
            raise ConfigError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be > 0 (seconds)")
    if args.rm_max_retries < 1:
        raise ConfigError(f"--rm-max-retries {args.rm_max_retries}: must be >= 1 (attempts per sample, the first "
                          "included)")
    if args.max_tool_turns < 0:
        raise ConfigError(f"--max-tool-turns {args.max_tool_turns}: must be >= 0")
    if not args.tool_call_end:
        raise ConfigError("--tool-call-end must be a non-empty stop string, e.g. '</tool>'")
    if (args.rm_type or "").removeprefix("boxed_") == "ifbench":  # before any engine starts
        raise ConfigError("--rm-type ifbench is not available in slime_like: slime clones github.com/allenai/IFBench "
                          "at run time for its instruction checkers (not on PyPI, not shipped here). Clone it "
                          "yourself and pass --custom-rm-path to a function calling its instructions_registry")
    if args.rm_type == "remote_rm" and not args.rm_url:
        raise ConfigError("--rm-type remote_rm needs --rm-url http://HOST:PORT/...")


def _fully_async(args):
    """--max-staleness belongs to the fully async rollout; over-sampling has no meaning there (one group at a
    time, continuously)."""
    if not is_fully_async(args):
        if args.max_staleness is not None:
            warn(args, f"--max-staleness {args.max_staleness} has no effect: only the fully async rollout "
                       "(--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async, "
                       "train_async.py) generates ahead of the trainer by more than one step")
        return
    if args.max_staleness is None:
        args.max_staleness = 1
    if args.max_staleness < 0:
        raise ConfigError(f"--max-staleness {args.max_staleness}: must be >= 0 (0: every sample is generated by "
                          "the weights it is trained with)")
    if args.max_staleness < args.update_weights_interval - 1:
        raise ConfigError(f"--max-staleness {args.max_staleness} with --update-weights-interval "
                          f"{args.update_weights_interval}: the engines keep one version for "
                          f"{args.update_weights_interval} training steps, so the last of them trains samples "
                          f"{args.update_weights_interval - 1} version(s) behind; set --max-staleness >= "
                          f"{args.update_weights_interval - 1} or push more often")
    if args.over_sampling_batch_size != args.rollout_batch_size:
        warn(args, f"--over-sampling-batch-size {args.over_sampling_batch_size} has no effect with the fully async "
                   "rollout: it starts one prompt group at a time, as many as --max-staleness allows")


def _num_rollout_from_epochs(args):
    """slime: num_rollout = num_epoch * dataset_size // rollout_batch_size (JSONL records counted here)."""
    if args.num_epoch < 1:
        raise ConfigError(f"--num-epoch {args.num_epoch}: must be >= 1")
    files = [args.prompt_data, *(args.prompt_data_extra or [])]
    if not args.prompt_data or not all(f.endswith(".jsonl") for f in files):
        raise ConfigError(f"--num-epoch needs a JSONL --prompt-data (and JSONL --prompt-data-extra files) to count "
                          f"prompts (got {' '.join(map(str, files))}); set --num-rollout instead")
    if not all(os.path.isfile(f) for f in files):
        return  # reported as a missing path
    n = 0
    for path in files:
        with open(path, "rb") as f:
            n += sum(1 for line in f if line.strip())
    args.num_rollout = max(1, args.num_epoch * n // args.rollout_batch_size)
    args.num_rollout_per_epoch = max(1, n // args.rollout_batch_size)  # slime saves / evaluates at epoch ends
    if args.rollout_max_prompt_len is not None:
        warn(args, f"--num-rollout {args.num_rollout} derived from --num-epoch {args.num_epoch} x {n} prompts counted "
                   "before --rollout-max-prompt-len filtering")


def _checkpoints(args):
    if args.save_interval is not None:
        if not args.save:
            raise ConfigError(f"--save-interval {args.save_interval} needs --save DIR (where checkpoints go)")
        if args.save_interval < 1:
            raise ConfigError(f"--save-interval {args.save_interval}: must be >= 1")
    if args.hf_checkpoint and not args.debug_train_only and not os.path.isdir(args.hf_checkpoint):
        what = "is a file, not a directory" if os.path.isfile(args.hf_checkpoint) else "no such directory"
        _path_problem(args, f"--hf-checkpoint {args.hf_checkpoint}: {what} (it provides the tokenizer, "
                            "config.json and the engines' initial weights)")
    if not args.hf_checkpoint:
        raise ConfigError("--hf-checkpoint DIR is required (tokenizer, config.json, engine weights)")


def _debug(args):
    if args.load_debug_rollout_data is not None:
        args.debug_train_only = True
    if args.debug_rollout_only and args.debug_train_only:
        raise ConfigError("--debug-rollout-only and --debug-train-only (or --load-debug-rollout-data) exclude each other")
    if args.dump_details is not None:
        # slime's layout; JSON files (debug dumps are never pickles here), hence the .json names
        args.save_debug_rollout_data = f"{args.dump_details}/rollout_data/{{rollout_id}}.json"
        args.save_debug_train_data = f"{args.dump_details}/train_data/{{rollout_id}}.json"
    if args.bf16 and args.fp16:
        raise ConfigError("--bf16 and --fp16 exclude each other; choose one")


def _model(args):
    """Megatron's own derived model defaults, so the dry run shows what the trainer will build."""
    if args.num_attention_heads and args.hidden_size:
        if args.kv_channels is None:
            if args.hidden_size % args.num_attention_heads:
                raise ConfigError(f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads "
                                  f"{args.num_attention_heads}; set --kv-channels explicitly")
            args.kv_channels = args.hidden_size // args.num_attention_heads
        if not args.group_query_attention:
            args.num_query_groups = args.num_attention_heads
        elif args.num_attention_heads % args.num_query_groups:
            raise ConfigError(f"--num-attention-heads {args.num_attention_heads} is not a multiple of "
                              f"--num-query-groups {args.num_query_groups}")
        if args.ffn_hidden_size is None:
            h = args.hidden_size
            args.ffn_hidden_size = int(4 * h * 2 / 3 / 64) * 64 if args.swiglu else 4 * h
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"
    if (args.attention_dropout or args.hidden_dropout) and args.loss_type != "sft_loss":
        warn(args, f"--attention-dropout {args.attention_dropout} / --hidden-dropout {args.hidden_dropout} (Megatron's "
                   "defaults are 0.1): the trainer's log-probs will not match the rollout engine's; RL recipes pass "
                   "--attention-dropout 0.0 --hidden-dropout 0.0")
    if args.num_experts and args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    if args.max_position_embeddings is None and args.seq_length is not None:
        args.max_position_embeddings = args.seq_length


def _misc_defaults(args):
    if args.run_dir is None:
        args.run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    if args.use_wandb and args.wandb_dir is None:
        args.wandb_dir = os.path.join(args.run_dir, "wandb")
    if args.use_tensorboard and args.tensorboard_dir is None:
        args.tensorboard_dir = os.path.join(args.run_dir, "tensorboard")
    args.rollout_external = args.rollout_external_engine_addrs is not None

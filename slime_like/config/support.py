"""Which accepted flags slime_like does not honour, and what happens when a run sets one.

slime recipes must parse unchanged, so the parser accepts hundreds of Megatron/slime flags. A flag we
accept but do not act on must never be dropped silently. Every parser dest is therefore either read by
what train.py / train_async.py run outside `slime_like/config/` (tests/config/test_flag_audit.py finds the
reads with `ast`) or listed in exactly one table here:

- `UNSUPPORTED`: a non-default value is refused AT LAUNCH (train.py / train_async.py without --dry-run, before
  Ray or torch start) naming the flag, the value and what to do instead. A configuration valid on GPUs is never
  rejected while parsing: `--dry-run` prints its plan with a "refused at launch" section. The slime-only flags
  of unimplemented.SLIME_ONLY_FLAGS (features with no behaviour here) are refused the same way, under their dests.
- `NO_EFFECT_HERE`: harmless performance / kernel / memory hints; a non-default value prints one
  `WARNING:` line saying why it changes nothing here.
- `INFORMATIONAL`: consumed by the configuration layer itself (derived defaults, role views, files it reads).
- `ALWAYS_ON`: store_true switches whose behaviour slime_like always has (nothing to say when set).

`--sglang-*` passthrough values are not parser dests on a CPU machine; engines.check_engine_passthrough warns
about those no engine will see (the CPU engine understands three of them; external engines none).

Why one module and not a table per concern: a dest sits in exactly one table, and the flag audit and the launch
check look a dest up across all of them; split by concern, that invariant would span ten files. Inside each
table the entries are grouped by concern (model architecture, MoE, parallelism, checkpoints, rollout, ...).

`APPLIES_WHEN` narrows a rule to the cases where the value really is ignored (e.g. --no-position-embedding
is exactly what a RoPE model does anyway). "Non-default" compares against the parser's own default, on the
command-line value before validation derives anything. `# pending: <area>` marks flags another part of the
product should honour; once it does, delete the entry (the audit test then finds the reader).
"""
from __future__ import annotations

import functools

from slime_like.config.errors import ConfigError
from slime_like.config.slime_paths import BUILT_SPECS, foreign
from slime_like.config.unimplemented import SLIME_ONLY_FLAGS
from slime_like.registry import TRAINER_BACKENDS
from slime_like.registry import version as registry_version

_MEGATRON = "the Megatron trainer does not implement it"
_ARCH = "the Megatron trainer builds the model without it, so the weights would be used wrongly"
_MOE_ROUTER = "the Megatron trainer's MoE router does not pass it to megatron-core (routing would differ)"
_ISSUE18 = "not implemented in slime_like yet (issue 18, slime features, adds it)"
_BUFFER = "slime's external rollout buffer (agent examples) is not implemented; use --custom-generate-function-path"
_MTP_DROPPED = ("without --enable-mtp-training the Megatron trainer builds and trains the main model only (MTP layers "
                "are dropped: a checkpoint's num_nextn_predict_layers are not loaded, HF exports leave them out, "
                "engines doing speculative decoding keep their own draft weights, so acceptance may fall as the "
                "policy moves; outputs stay exact)")
_FP8 = "FP8 needs TransformerEngine on Hopper-class GPUs and the Megatron trainer does not implement it; use --bf16"

UNSUPPORTED = {
    # model architecture: a different network than the one asked for
    "rotary_seq_len_interpolation_factor": f"RoPE position interpolation: {_ARCH}",  # pending: megatron
    "add_position_embedding": "learned absolute positions switched off without RoPE: "  # pending: megatron
                              "use --position-embedding-type rope (or none)",
    "apply_layernorm_1p": "the Megatron trainer builds zero-centred norms for --normalization RMSNorm only "
                          "(Qwen3-Next / Qwen3.5)",
    "apply_residual_connection_post_layernorm": f"post-layernorm residual: {_ARCH}",  # pending: megatron
    "openai_gelu": f"tanh-approximate GeLU: {_ARCH}",  # pending: megatron
    "squared_relu": f"squared ReLU: {_ARCH}",  # pending: megatron
    # pending: megatron
    "padded_vocab_size": "the trainer pads the vocabulary itself (--make-vocab-size-divisible-by x TP); "
                         "drop it or set --make-vocab-size-divisible-by",
    "rotary_scaling_factor": "it is the YaRN factor of multi-latent attention; Megatron-LM builds Llama 3.x "
                             "scaling from --rope-scaling-factor (default 8.0) and ignores this one without "
                             "--multi-latent-attention. Pass --use-rope-scaling --rope-scaling-factor VALUE "
                             "(config.json's rope_scaling.factor)",
    "mscale": "a YaRN setting of multi-latent attention; without --multi-latent-attention it changes nothing",
    "mscale_all_dim": "a YaRN setting of multi-latent attention; without --multi-latent-attention it changes nothing",
    "attention_output_gate": "megatron-core 0.16 has no output gate for multi-latent attention",
    "use_gated_attention": "megatron-core 0.16 has no output gate for multi-latent attention",
    "custom_model_provider_path": f"custom model providers: {_MEGATRON}",  # pending: megatron
    "spec": "custom layer specs: the Megatron trainer builds its own; of slime's plugins it builds "
            "`slime_plugins.models.glm4 get_glm_spec` (GLM-4 sandwich norms), `slime_plugins.models.minimax_m2 "
            "get_minimax_m2_layer_spec` (MiniMax-M2's query / key norm over all heads), "
            "`slime_plugins.models.qwen3_next get_qwen3_next_spec` and `slime_plugins.models.qwen3_5 "
            "get_qwen3_5_spec` (gated delta net layers from config.json's layer_types) and "
            "`slime_plugins.models.glm5.glm5 get_glm5_spec` (DeepSeek sparse attention) only",
    # MoE routing / MTP
    "moe_z_loss_coeff": _MOE_ROUTER,  # pending: megatron
    "moe_input_jitter_eps": _MOE_ROUTER,  # pending: megatron
    "moe_token_drop_policy": _MOE_ROUTER,  # pending: megatron
    "moe_expert_capacity_factor": _MOE_ROUTER,  # pending: megatron
    "moe_pad_expert_input_to_capacity": _MOE_ROUTER,  # pending: megatron
    # parallelism the trainer cannot run (it would also fail later, inside a Ray actor)
    # pending: megatron
    "account_for_embedding_in_pipeline_split": f"uneven pipeline split: {_MEGATRON}",  # pending: megatron
    "account_for_loss_in_pipeline_split": f"uneven pipeline split: {_MEGATRON}",  # pending: megatron
    "megatron_deepgemm_forward_layers": f"SGLang's block-FP8 DeepGEMM forward in the trainer: {_FP8}",
    "megatron_deepgemm_forward_modules": f"SGLang's block-FP8 DeepGEMM forward in the trainer: {_FP8}",
    "megatron_deepgemm_moe_forward_layers": f"SGLang's block-FP8 DeepGEMM forward in the trainer: {_FP8}",
    "megatron_deepgemm_moe_forward_modules": f"SGLang's block-FP8 DeepGEMM forward in the trainer: {_FP8}",
    # precision / optimizer
    "min_loss_scale": "fp16 dynamic loss scaling keeps megatron-core's defaults; drop it",  # pending: megatron
    "loss_scale_window": "fp16 dynamic loss scaling keeps megatron-core's defaults; drop it",  # pending: megatron
    "hysteresis": "fp16 dynamic loss scaling keeps megatron-core's defaults; drop it",  # pending: megatron
    # checkpoints
    "ref_ckpt_step": "the reference model loads the latest step of --ref-load; drop it",  # pending: megatron
    # pending: megatron (read by tools/convert_megatron_to_hf.py and the FSDP trainer)
    "save_hf": "the Megatron trainer does not export HF weights while training (--train-backend fsdp does); "
               "convert a saved step afterwards with "
               "python tools/convert_megatron_to_hf.py --load SAVE_DIR --hf-checkpoint HF --save-hf DIR",
    "no_save_rng": "RNG state is always saved with a checkpoint",  # pending: megatron
    # pending: megatron
    "no_load_rng": "RNG state is restored together with the optimizer state; --no-load-optim skips both",
    "ckpt_format": "checkpoints are written and read as torch_dist only",  # pending: megatron
    # algorithm
    "use_rollout_entropy": f"entropy from rollout log-probs: {_MEGATRON}",  # pending: megatron
    # rollout / data
    # weight sync through files, agent rollout buffers
    "custom_update_weight_post_write_path": "publishing a disk sync's files on a non-POSIX filesystem: "
                                            "--update-weight-disk-dir must be a mount the engines see directly",
    "rollout_buffer_url": _BUFFER,
    "fetch_trajectory_retry_times": _BUFFER,
    "rollout_task_type": _BUFFER,
    "min_batch_collection_ratio": _BUFFER,
    "use_distributed_post": _BUFFER,
    "rollout_global_dataset": "the rollout always samples prompts from --prompt-data (a custom "
                              "--custom-generate-function-path may ignore them)",
    "http_proxy": "the rollout's HTTP client connects to the engines and reward models directly (no proxy)",
    # logging / debugging outputs that would silently be missing
    "wandb_always_use_train_step": "the wandb x-axis is always the rollout id",  # pending: utils
    "record_memory_history": "CUDA memory-history snapshots are not recorded",  # pending: megatron
    "memory_snapshot_dir": "CUDA memory-history snapshots are not recorded",  # pending: megatron
}

NO_EFFECT_HERE = {
    "mtp_num_layers": _MTP_DROPPED,
    "mtp_loss_scaling_factor": f"it scales the loss of --enable-mtp-training only; {_MTP_DROPPED}",
    "use_flash_attn": "the trainer chooses attention kernels itself (TransformerEngine on CUDA, unfused on CPU)",
    # pending: megatron
    "moe_enable_deepep": "DeepEP dispatch is not wired (tokens use the alltoall dispatcher)",
    "moe_shared_expert_overlap": "shared-expert overlap is not wired (same results, no overlap)",  # pending: megatron
    "use_precision_aware_optimizer": "the optimizer keeps fp32 master weights and states (TE's precision-aware "
                                     "optimizer is not wired)",
    # pending: megatron
    "optimizer_cpu_offload": "optimizer states stay on the accelerator (colocated runs offload them "
                             "between steps with --offload-train)",
    "overlap_param_gather": "parameter all-gather is not overlapped (same results)",  # pending: megatron
    "distributed_backend": "the trainers use NCCL on CUDA and gloo on CPU automatically",
    "recompute_modules": "selective recompute uses megatron-core's default modules",  # pending: megatron
    "recompute_loss_function": "memory optimisation only; the loss is computed without it",  # pending: megatron
    "log_probs_chunk_size": "memory optimisation only; log-probs are computed in one piece",  # pending: megatron
    "async_save": "checkpoints are saved synchronously (same files)",
    "auto_detect_ckpt_format": "checkpoints are torch_dist; nothing to detect",
    "tokenizer_type": "the tokenizer is always read from --hf-checkpoint (as slime does)",
    "tokenizer_model": "the tokenizer is always read from --hf-checkpoint (as slime does)",
    "model_name": "HF weight names follow --hf-checkpoint's config.json model_type",
    # TE's CP attention reads it (TransformerConfig.cp_comm_type); the local spec's CP attention is all-gather only
    "cp_comm_type": "context parallelism is off (--context-parallel-size 1); with CP > 1 TransformerEngine's CP "
                    "attention reads it, and without TE the CP attention all-gathers keys and values",
    "log_interval": "the driver logs one console line per rollout",  # pending: utils
    "overlap_cpu_optimizer_d2h_h2d": "optimizer states are not offloaded to the CPU during a step (see "
                                     "--optimizer-cpu-offload), so there are no copies to overlap",
    "enable_experimental": "no experimental megatron-core feature is reachable through slime_like's flags",
    "balance_by_flops": "micro-batches are packed by token count (the same loss; only the load balance differs)",
    "data_pad_size_multiplier": "packed micro-batches are padded to their longest sample (the multiplier is a "
                                "kernel-alignment hint)",
    "qwen_gdn_backend": "a gated-delta-net kernel choice: the trainer's gated delta net runs flash-linear-attention's "
                        "chunked kernel where CUDA and fla are present, its own exact recurrence otherwise",
    "memory_recorder": "CUDA memory-history snapshots are not recorded",
    "memory_snapshot_num_steps": "CUDA memory-history snapshots are not recorded",
    "profile_target": "no profiler is wired to the trainer",
}

INFORMATIONAL = {
    "megatron_config_path": "role_overrides.py reads the YAML into args.megatron_role_overrides",
    "update_weight_mode": "engines.py: full (slime's default) or delta (engine_api/delta_sync.py)",
    "rollout_data_transport": "rollout.py: object-store (slime's default) is how rollout data moves; nixl is "
                              "refused at launch",
    "custom_config_path": "custom_config.py sets the YAML's keys on args (flags validated as flags)",
    "seq_length": "validate.py: --max-position-embeddings defaults to it (the length the model is built for)",
    "sglang_config": "sglang_passthrough.py merges the file into args.sglang_server_args",
    "vllm_config": "vllm_passthrough.py merges the file into args.vllm_server_args",
    "critic_lr": "role_overrides.apply_role: the critic's lr",
    "critic_lr_warmup_iters": "role_overrides.apply_role: the critic's lr_warmup_iters",
    "critic_load": "role_overrides.apply_role: the critic's load",
    "critic_save": "role_overrides.apply_role: the critic's save",
    "offload": "cluster.py: sets offload_train and offload_rollout",
    "num_epoch": "validate.py: derives num_rollout from the prompt count",
    "debug_train_only": "cluster.py / plan.py: no local engines",
    "dump_details": "validate.py: sets --save-debug-rollout-data and --save-debug-train-data to files under it",
    "eval_config": "eval_config.py reads the file into args.eval_datasets (and --eval-prompt-data), read by "
                   "rollout/eval.py",
    # the LR schedule's arithmetic lives in config/schedule.py: the trainer's scheduler and the preflight use it
    "lr_warmup_iters": "schedule.py: warm-up steps", "lr_warmup_fraction": "schedule.py: warm-up as a fraction",
    "lr_decay_iters": "schedule.py: the decay horizon", "train_iters": "schedule.py: the decay horizon's fallback",
    "config": "frontends/ translates the RLinf / ROLL file into flags spliced into the command line",
    "config_format": "frontends/ picks the translator (or detects it from the file's top-level keys)",
    "placement": "cluster.py parses it (placement_spec.py) into args.placement_map, read by plan.py",
    "prompt_template": "data.py turns it into apply_chat_template (+ a ChatML chat_template)",
    "use_rotary_position_embeddings": "hf_config.fill_args_from_hf (called by the trainer): position_embedding_type "
                                      "rope",
}

# Switches whose behaviour is always on in slime_like, so setting them asks for what happens anyway (no message).
ALWAYS_ON = {
    "accumulate_allreduce_grads_in_fp32": "backends/megatron/optimizer.py builds DDP with grad_reduce_in_fp32=True",
}

# A slime-only flag's dest -> its feature (rejected on the command line while parsing, and here in YAML).
SLIME_ONLY = {flag[2:].replace("-", "_"): feature for flag, feature in SLIME_ONLY_FLAGS.items()}

# Role overlays (--megatron-config-path) reach only the trainers (role_args -> the actor / critic ranks); the
# engines, the rollout manager and the driver read the shared command line. So a role key must be a trainer
# setting: one of these groups, or one of the extra trainer-read dests below. rollout_temperature,
# global_batch_size, num_steps_per_rollout and num_rollout are read by the trainers too, but must equal the
# rollout side's values, so they stay shared.
ROLE_GROUPS = ("model", "model (MoE)", "checkpoint", "perf/parallelism", "algorithm (GRPO/PPO)",
               "optimizer & LR schedule", "fsdp / LoRA")
ROLE_EXTRA_KEYS = ("micro_batch_size", "update_weight_buffer_size")

# dest -> predicate(args_view, value): the rule applies only when this is true.
APPLIES_WHEN = {
    # slime's llama files pass --use-rope-scaling --rotary-scaling-factor F: refused only where F is not what
    # Megatron builds anyway (--rope-scaling-factor, 8.0 unless set), e.g. Llama 3.2's 32
    "rotary_scaling_factor": lambda a, v: not a.multi_latent_attention
    and not (a.use_rope_scaling and v == a.rope_scaling_factor),
    "mscale": lambda a, v: not a.multi_latent_attention,
    "mscale_all_dim": lambda a, v: not a.multi_latent_attention,
    "save_hf": lambda a, v: not TRAINER_BACKENDS.has(a.train_backend, "saves_hf"),
    "spec": lambda a, v: tuple(v) not in BUILT_SPECS,
    "apply_layernorm_1p": lambda a, v: a.normalization != "RMSNorm",
    "attention_output_gate": lambda a, v: a.multi_latent_attention,
    "use_gated_attention": lambda a, v: a.multi_latent_attention,
    "mtp_num_layers": lambda a, v: not a.enable_mtp_training,  # built and trained with --enable-mtp-training
    "mtp_loss_scaling_factor": lambda a, v: not a.enable_mtp_training,
    "add_position_embedding": lambda a, v: a.position_embedding_type == "learned_absolute"
    and not a.use_rotary_position_embeddings,
    "tokenizer_model": lambda a, v: v != a.hf_checkpoint,
    "cp_comm_type": lambda a, v: a.context_parallel_size == 1,
}


_ABSENT = object()



def _flag_info() -> dict:
    """dest -> (option string users type, parser default, is a boolean switch, argparse group title)."""
    return _flag_info_at(registry_version())


@functools.lru_cache(maxsize=1)
def _flag_info_at(version: int) -> dict:
    import argparse

    from slime_like.config.parser import defaults_of, group_of, shared_parser  # late: built on first use

    parser = shared_parser()
    defaults, groups = defaults_of(parser), group_of(parser)  # defaults converted: '{}' -> {}
    out = {}
    for action in parser._actions:
        if action.dest == "help" or not action.option_strings:
            continue
        switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        out[action.dest] = (action.option_strings[0], defaults.get(action.dest), switch, groups[action.dest])
    return out


def _describe(dest: str, value) -> str:
    flag, _, switch, _ = _flag_info()[dest]
    if switch:
        return flag
    shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    return f"{flag} {shown}"


def _is_set(args, dest: str, value) -> bool:
    default = _flag_info()[dest][1]
    if value is None and default is None or value == default:
        return False
    return APPLIES_WHEN.get(dest, lambda a, v: True)(args, value)


def check_flag_support(args, report) -> None:
    """Start-up check of the command line (call before validation derives anything).

    Collects the UNSUPPORTED / slime-only flags into the report's launch refusals (refused by
    `ConfigReport.refuse_at_launch`, listed by --dry-run) and warns about the NO_EFFECT_HERE ones."""
    refusals = report.launch_refusals
    for dest, why in UNSUPPORTED.items():
        value = getattr(args, dest, _ABSENT)  # a hand-built namespace may lack a dest: nothing was set
        if value is not _ABSENT and _is_set(args, dest, value):
            refusals.append(f"{_describe(dest, value)} is accepted for slime/Megatron compatibility but not "
                            f"honoured by slime_like: {why}. Remove it from the command line")
    for dest, feature in SLIME_ONLY.items():
        if hasattr(args, dest):  # default=SUPPRESS: present only when given
            refusals.append(f"--{dest.replace('_', '-')} is a slime flag for {feature}, which slime_like does not "
                            "implement; remove it (docs/configuration.md lists these flags)")
    for dest, value in vars(args).items():
        if dest.endswith("_path") and dest not in UNSUPPORTED and any(map(foreign, _as_list(value))):
            refusals.append(f"{_describe(dest, value)} names slime's own code, which is not part of slime_like "
                            "(only config/slime_paths.ALIASES are); point it at a function of yours or of slime_like")
    for dest, why in NO_EFFECT_HERE.items():
        value = getattr(args, dest, _ABSENT)
        if value is not _ABSENT and _is_set(args, dest, value):
            report.warn(f"{_describe(dest, value)} is accepted but not honoured here (no effect): {why}")


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_role_overrides_support(args, report) -> None:
    """The same rules for the per-role YAML overlay (keys are dests; the CLI is the baseline)."""
    path = args.megatron_config_path
    for role, overrides in (args.megatron_role_overrides or {}).items():
        view = _Overlay(args, overrides)
        for key, value in overrides.items():
            where = f"{path} (role {role}): key '{key}'"
            if key in SLIME_ONLY:
                raise ConfigError(f"{where} is a slime setting for {SLIME_ONLY[key]}, which slime_like does not "
                                  "implement; remove it")
            group = _flag_info()[key][3] if key in _flag_info() else None
            if group not in ROLE_GROUPS and key not in ROLE_EXTRA_KEYS:
                raise ConfigError(f"{where} is a {group} setting of the whole run: role overrides reach only the "
                                  f"trainers, so a per-role value would be ignored or disagree with the rollout "
                                  f"side. Set {_flag_info()[key][0]} on the command line instead")
            if key in UNSUPPORTED and _is_set(view, key, value):
                report.refuse(f"{where}: {value!r} is not honoured by slime_like: {UNSUPPORTED[key]}. "
                              "Remove the key")
            if key in NO_EFFECT_HERE and _is_set(view, key, value):
                report.warn(f"{where}: {value!r} is accepted but not honoured here (no effect): {NO_EFFECT_HERE[key]}")


class _Overlay:
    """Attribute view of `args` with one role's overrides on top (for APPLIES_WHEN predicates)."""

    def __init__(self, args, overrides: dict):
        self._args, self._over = args, overrides

    def __getattr__(self, name):
        return self._over[name] if name in self._over else getattr(self._args, name)

"""Checks of --train-backend fsdp and the LoRA flags, before Ray or torch start: Megatron-only parallelism or
checkpoints with fsdp, fsdp checkpoints with megatron, LoRA with megatron, unknown --lora-target-modules."""
from __future__ import annotations

import os

from slime_like.config.errors import ConfigError, warn
from slime_like.config.validate_cluster import cuda_visible

# Megatron-only performance settings: with --train-backend fsdp they change nothing (FSDP2 shards params, grads
# and optimizer state by itself), so setting one warns instead of being silently dropped.
MEGATRON_ONLY = {
    "use_distributed_optimizer": "FSDP always shards the optimizer state",
    "overlap_grad_reduce": "FSDP2 overlaps its reduce-scatter with backward by itself",
    "overlap_param_gather": "FSDP2 prefetches all-gathers itself (see --fsdp-forward-prefetch)",
    "recompute_method": "the FSDP trainer recomputes every decoder layer with --recompute-granularity full",
    "recompute_num_layers": "the FSDP trainer recomputes every decoder layer with --recompute-granularity full",
    "use_precision_aware_optimizer": "the FSDP optimizer is torch AdamW over fp32 sharded params",
    "optimizer_cpu_offload": "use --fsdp-cpu-offload (params, grads and optimizer state)",
}

def validate_fsdp(args) -> None:
    """Backend-specific input checks, before Ray starts."""
    if args.train_backend == "fsdp":
        _fsdp_only(args)
    else:
        for dest, flag in (("load", "--load"), ("ref_load", "--ref-load"), ("critic_load", "--critic-load")):
            path = getattr(args, dest, None)
            if path and _is_fsdp_checkpoint(path):
                raise ConfigError(f"{flag} {path} is a --train-backend fsdp (DCP) checkpoint; the Megatron trainer "
                                  "reads torch_dist and HF directories: add --train-backend fsdp, or export HF "
                                  "weights with --save-hf and load those")
    if args.train_backend != "fsdp" and args.lora_rank:
        raise ConfigError(f"--lora-rank {args.lora_rank} needs --train-backend fsdp: the Megatron trainer has no "
                          "LoRA (its fused layers and distributed optimizer are not wired for adapters); use "
                          "--train-backend fsdp --hf-checkpoint DIR, or drop --lora-rank")
    if args.lora_rank < 0:
        raise ConfigError(f"--lora-rank {args.lora_rank} must be >= 0 (0 = no LoRA)")
    if not 0.0 <= args.lora_dropout < 1.0:
        raise ConfigError(f"--lora-dropout {args.lora_dropout} must be in [0, 1)")
    if args.lora_rank and args.train_backend == "fsdp":
        _check_lora_targets(args)
    if args.lora_save_merged and not args.lora_rank:
        raise ConfigError("--lora-save-merged needs --lora-rank > 0 (without LoRA --save-hf writes the full model)")


# slime's trainer hooks that only the Megatron trainer calls: they receive megatron-core model chunks, or work in
# mcore's loss units. (--custom-advantage-function-path and --rollout-data-postprocess-path see args and the batch
# only: RLTrainerBase calls them for both backends.)
MEGATRON_HOOKS = ("custom_megatron_init_path", "custom_megatron_before_log_prob_hook_path",
                  "custom_megatron_before_train_step_hook_path", "custom_tis_function_path",
                  "custom_loss_function_path", "custom_pg_loss_reducer_function_path")


def _fsdp_only(args):
    for dest in MEGATRON_HOOKS:
        if getattr(args, dest, None):
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(args, dest)}: this trainer hook is called by the Megatron trainer "
                              "only; --train-backend fsdp does not call it: drop the flag or use megatron")
    for dest, flag in (("tensor_model_parallel_size", "--tensor-model-parallel-size"),
                       ("pipeline_model_parallel_size", "--pipeline-model-parallel-size"),
                       ("context_parallel_size", "--context-parallel-size"),
                       ("expert_model_parallel_size", "--expert-model-parallel-size")):
        value = getattr(args, dest, 1) or 1
        if value > 1:
            raise ConfigError(f"{flag} {value} is Megatron parallelism; --train-backend fsdp shards data-parallel "
                              f"only: drop {flag} (or use --train-backend megatron)")
    _fsdp_weight_sources(args)
    if args.fsdp_sharding_strategy == "hybrid_shard" and not args.fsdp_size:
        raise ConfigError("--fsdp-sharding-strategy hybrid_shard needs --fsdp-size N (ranks per shard group)")
    if args.fsdp_size is not None and args.fsdp_size < 1:
        raise ConfigError(f"--fsdp-size {args.fsdp_size} must be >= 1")
    if args.recompute_granularity == "selective":
        raise ConfigError("--recompute-granularity selective is Megatron's core-attention recompute; the FSDP "
                          "trainer recomputes whole decoder layers: use --recompute-granularity full")
    if args.fsdp_autocast == "fp16" or args.fsdp_param_dtype == "fp16" or args.fp16:
        raise ConfigError("fp16 with --train-backend fsdp needs a sharded gradient scaler, which is not wired; "
                          "use bf16 (--bf16 / --fsdp-param-dtype bf16 / --fsdp-autocast bf16)")
    for dest, why in MEGATRON_ONLY.items():
        if getattr(args, dest, None):
            flag = "--" + dest.replace("_", "-")
            warn(args, f"{flag} has no effect with --train-backend fsdp: {why}")
    if args.fsdp_cpu_offload and not cuda_visible():
        warn(args, "--fsdp-cpu-offload has no effect on a CPU-only machine: the parameters already live in CPU "
                   "memory")


def _fsdp_weight_sources(args):
    """--ref-load / --load / --opd-teacher-load must be HF directories (or, --load, the FSDP trainer's DCP)."""
    for dest, flag in (("ref_load", "--ref-load"), ("load", "--load"), ("opd_teacher_load", "--opd-teacher-load")):
        path = getattr(args, dest, None)
        if path and _is_megatron_checkpoint(path):
            raise ConfigError(f"{flag} {path} is a Megatron torch_dist checkpoint; --train-backend fsdp reads HF "
                              f"directories and its own DCP checkpoints: convert it with python "
                              f"tools/convert_megatron_to_hf.py --load {path} --save-hf DIR and pass {flag} DIR")
    if args.ref_load and os.path.isfile(os.path.join(args.ref_load, "latest_checkpointed_iteration.txt")):
        raise ConfigError(f"--ref-load {args.ref_load} is a training checkpoint; the FSDP reference model loads an HF "
                          "directory (write one with --save-hf, or drop --ref-load to use --hf-checkpoint)")
    teacher = args.opd_teacher_load
    if teacher and os.path.isfile(os.path.join(teacher, "latest_checkpointed_iteration.txt")):
        raise ConfigError(f"--opd-teacher-load {teacher} is a training checkpoint; the FSDP trainer's OPD teacher "
                          "loads an HF directory (write one with --save-hf or tools/convert_megatron_to_hf.py)")
    if args.opd_teacher_ckpt_step is not None:
        raise ConfigError(f"--opd-teacher-ckpt-step {args.opd_teacher_ckpt_step} picks an iteration of a torch_dist "
                          "teacher; --train-backend fsdp loads the teacher from an HF directory (--opd-teacher-load "
                          "DIR): drop the flag")


def _is_megatron_checkpoint(path) -> bool:
    """A torch_dist directory: Megatron's iteration marker and a `common.pt` in the iteration it names (the
    FSDP trainer's DCP checkpoints use the same marker but have no common.pt)."""
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        return os.path.isfile(os.path.join(path, "common.pt"))  # an iter_* directory passed directly
    text = open(tracker).read().strip()
    return text.isdigit() and os.path.isfile(os.path.join(path, f"iter_{int(text):07d}", "common.pt"))


def _check_lora_targets(args):
    """Every --lora-target-modules name must be a linear module of the model (built on the meta device from
    config.json: no weights read, no memory), else an error listing the names the model has."""
    targets = list(args.lora_target_modules)
    if targets == ["all-linear"] or not os.path.isfile(os.path.join(args.hf_checkpoint or "", "config.json")):
        return
    if "all-linear" in targets:
        raise ConfigError("--lora-target-modules all-linear cannot be combined with module names; use one or the other")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(args.hf_checkpoint)
    except (ValueError, KeyError, OSError):  # a config transformers cannot build: the trainer will say why
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    missing = [t for t in targets if t not in names]
    if missing:
        raise ConfigError(f"--lora-target-modules {' '.join(missing)}: {args.hf_checkpoint} has no such linear "
                          f"module; its linear modules are: {' '.join(names)} (or use all-linear)")


def _is_fsdp_checkpoint(path) -> bool:
    """A checkpoint root written by the FSDP trainer: its published iteration holds fsdp_meta.json."""
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        return False
    text = open(tracker).read().strip()
    return text.isdigit() and os.path.isfile(os.path.join(path, f"iter_{int(text):07d}", "fsdp_meta.json"))

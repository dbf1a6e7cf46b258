"""The FSDP2 trainer backend (`--train-backend fsdp`) and LoRA: flags and checks, before Ray or torch start:
Megatron-only parallelism or checkpoints with fsdp, fsdp checkpoints with megatron, LoRA with megatron,
unknown --lora-target-modules.

The FSDP trainer loads `--hf-checkpoint` through transformers and shards it with torch's FSDP2
(`fully_shard`); see docs/backends.md. RLinf's `actor.fsdp_config.*` and ROLL's `fsdp2_train`
strategy_config keys map onto these flags (the table is in docs/backends.md).
"""
from __future__ import annotations

import argparse
import os

from slime_like.config.checkpoint import is_megatron_checkpoint, raw_hf_config
from slime_like.config.cluster import cuda_visible
from slime_like.config.errors import ConfigError
from slime_like.registry import TRAINER_BACKENDS
from slime_like.config.types import Float, Int

SHARDING = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")
DTYPES = ("fp32", "bf16", "fp16")
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
# megatron-core's layer spec and kernel choices (backends/megatron/kernels.py): defaults that are truthy, so only a
# value the user named is worth a warning
MEGATRON_KERNEL_DESTS = ("transformer_impl", "attention_backend", "apply_rope_fusion", "gradient_accumulation_fusion",
                         "masked_softmax_fusion", "bias_swiglu_fusion", "bias_dropout_fusion")


def add_fsdp_group(parser):
    g = parser.add_argument_group("fsdp / LoRA", "(slime_like) --train-backend fsdp: HF model, FSDP2, DCP, LoRA")
    a = g.add_argument
    a("--fsdp-sharding-strategy", default="full_shard", choices=SHARDING,
      help="full_shard: params, grads, optimizer state sharded over all ranks, re-gathered per layer. "
           "shard_grad_op: same, but params stay gathered from forward to backward. hybrid_shard: shard within "
           "groups of --fsdp-size ranks, replicate across groups. no_shard: every rank holds everything (DDP).")
    a("--fsdp-size", type=Int(1), default=None,
      help="Ranks per shard group for hybrid_shard (ROLL's fsdp_size); default: all ranks.")
    a("--fsdp-reshard-after-forward", action=argparse.BooleanOptionalAction, default=None,
      help="Free gathered params after each layer's forward (default: on for full_shard / hybrid_shard).")
    a("--fsdp-param-dtype", default=None, choices=DTYPES,
      help="Mixed-precision policy: dtype of gathered params in forward/backward (default: fp32; bf16 with --bf16). "
           "The sharded master params and the optimizer stay fp32.")
    a("--fsdp-reduce-dtype", default="fp32", choices=DTYPES, help="Mixed-precision policy: gradient reduce dtype.")
    a("--fsdp-cpu-offload", action="store_true",
      help="Keep sharded params, grads and optimizer state in CPU memory (FSDP2 CPUOffloadPolicy); GPU only.")
    a("--fsdp-offload-pin-memory", action=argparse.BooleanOptionalAction, default=True,
      help="Pin the CPU-offloaded memory (faster host<->device copies); with --fsdp-cpu-offload.")
    a("--fsdp-forward-prefetch", action="store_true",
      help="Explicitly prefetch the next layer's all-gather during forward (more memory, more overlap).")
    a("--fsdp-defer-grad-sync", action=argparse.BooleanOptionalAction, default=True,
      help="Reduce-scatter gradients once after the step's last micro-batch, not after every micro-batch "
           "(RLinf enable_gradient_accumulation; more memory, less communication; same result).")
    a("--fsdp-autocast", default=None, choices=("bf16", "fp16"),
      help="Run forward/backward under torch.autocast with this dtype (RLinf amp_autocast).")
    a("--lora-rank", type=Int(0), default=0, help="LoRA rank (peft); 0 = train all weights. FSDP trainer only.")
    a("--lora-alpha", type=Float(0, lo_open=True), default=16.0,
      help="LoRA scaling numerator: updates are scaled by alpha / rank.")
    a("--lora-dropout", type=Float(0, 1, hi_open=True), default=0.0, help="Dropout on the LoRA branch input.")
    a("--lora-target-modules", nargs="+", default=["all-linear"],
      help="Module names (suffixes, e.g. q_proj v_proj) that get adapters; 'all-linear' = every linear layer "
           "except the output head.")
    a("--lora-save-merged", action="store_true",
      help="With --save-hf: also write the merged (base + adapter) model under <save-hf>/merged.")
    return parser


def check_lora(args, report) -> None:
    """The LoRA flags, after the trainer backend's own checks (registry validators, validate.py)."""
    backend, lora = args.train_backend, " or ".join(TRAINER_BACKENDS.with_capability("supports_lora"))
    if not TRAINER_BACKENDS.has(backend, "supports_lora") and args.lora_rank:
        why = TRAINER_BACKENDS.fact(backend, "why_no_lora")
        raise ConfigError(f"--lora-rank {args.lora_rank} needs --train-backend {lora}: "
                          f"{TRAINER_BACKENDS.display(backend)} has no LoRA{f' ({why})' if why else ''}; use "
                          f"--train-backend {lora} --hf-checkpoint DIR, or drop --lora-rank")
    if args.lora_rank < 0:
        raise ConfigError(f"--lora-rank {args.lora_rank} must be >= 0 (0 = no LoRA)")
    if not 0.0 <= args.lora_dropout < 1.0:
        raise ConfigError(f"--lora-dropout {args.lora_dropout} must be in [0, 1)")
    if args.lora_rank and TRAINER_BACKENDS.has(backend, "supports_lora"):
        _check_lora_targets(args)
    if args.lora_save_merged and not args.lora_rank:
        raise ConfigError("--lora-save-merged needs --lora-rank > 0 (without LoRA --save-hf writes the full model)")


# slime's trainer hooks that only the Megatron trainer calls: they receive megatron-core model chunks, or work in
# mcore's loss units. (--custom-advantage-function-path and --rollout-data-postprocess-path see args and the batch
# only: RLTrainerBase calls them for both backends.)
MEGATRON_HOOKS = ("custom_megatron_init_path", "custom_megatron_before_log_prob_hook_path",
                  "custom_megatron_before_train_step_hook_path", "custom_tis_function_path",
                  "custom_loss_function_path", "custom_pg_loss_reducer_function_path")


def check_fsdp_backend(args, report):
    """--train-backend fsdp's own checks (its registry validator): Megatron-only hooks, parallelism, checkpoints
    and performance flags."""
    for dest in MEGATRON_HOOKS:
        if getattr(args, dest, None):
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(args, dest)}: this trainer hook is called by the Megatron trainer "
                              "only; --train-backend fsdp does not call it: drop the flag or use megatron")
    for dest, flag in (("tensor_model_parallel_size", "--tensor-model-parallel-size"),
                       ("pipeline_model_parallel_size", "--pipeline-model-parallel-size"),
                       ("expert_model_parallel_size", "--expert-model-parallel-size")):
        value = getattr(args, dest, 1) or 1
        if value > 1:
            raise ConfigError(f"{flag} {value} is Megatron parallelism; --train-backend fsdp shards data-parallel "
                              f"(with Ulysses sequence parallelism: --context-parallel-size) only: drop {flag} (or "
                              "use --train-backend megatron)")
    check_ulysses(args, report)
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
            report.warn(f"{flag} has no effect with --train-backend fsdp: {why}")
    kernels = [d for d in MEGATRON_KERNEL_DESTS if d in args.cli_dests]
    if kernels:
        report.warn(f"{', '.join(kernels)} (set on the command line) have no effect with --train-backend fsdp: they "
                    "choose megatron-core's layer spec and kernels; the FSDP trainer runs the transformers model "
                    "(SDPA attention)")
    if args.fsdp_cpu_offload and not cuda_visible():
        report.warn("--fsdp-cpu-offload has no effect on a CPU-only machine: the parameters already live in CPU "
                    "memory")


def check_ulysses(args, report) -> None:
    """--context-parallel-size N > 1 with --train-backend fsdp: Ulysses sequence parallelism (backends/fsdp/ulysses.py;
    slime's FSDP backend reads the same flag, for ring attention). Every query head group must split over N; what
    its causal, unmasked all-to-all attention does not build is refused at launch, all problems in one message."""
    sp = args.context_parallel_size
    if sp <= 1:
        return
    cfg = raw_hf_config(args.hf_checkpoint)
    if cfg is None:
        return  # no readable config.json: the checkpoint checks say so
    where = f"--context-parallel-size {sp} (Ulysses sequence parallelism) with --hf-checkpoint {args.hf_checkpoint}"
    if isinstance(cfg.get("vision_config"), dict):
        report.refuse(f"{where}: a vision-language model; its image features and M-RoPE positions are computed over "
                      "whole sequences, which the sequence shards do not hold: use --context-parallel-size 1")
        return
    heads = cfg.get("num_attention_heads")
    if isinstance(heads, int) and heads % sp:
        raise ConfigError(f"{where}: num_attention_heads {heads} is not divisible by {sp} (each rank attends over "
                          f"heads / {sp} of them): use a --context-parallel-size that divides {heads}")
    problems = []
    layer_types = set(cfg.get("layer_types") or ())
    if cfg.get("use_sliding_window") or "sliding_attention" in layer_types:
        problems.append("sliding-window attention layers")
    if layer_types - {"full_attention", "sliding_attention"}:
        problems.append(f"layers other than attention ({', '.join(sorted(layer_types - {'full_attention', 'sliding_attention'}))})")
    if cfg.get("attn_logit_softcapping"):
        problems.append("attention logit softcapping")
    if problems:
        report.refuse(f"{where}: the model has {' and '.join(problems)}; the Ulysses attention runs plain causal "
                      "attention over whole sequences only: use --context-parallel-size 1")


def _fsdp_weight_sources(args):
    """--ref-load / --load / --opd-teacher-load must be HF directories (or, --load, the FSDP trainer's DCP)."""
    for dest, flag in (("ref_load", "--ref-load"), ("load", "--load"), ("opd_teacher_load", "--opd-teacher-load")):
        path = getattr(args, dest, None)
        if path and is_megatron_checkpoint(path):
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

"""The Megatron trainer backend: parallelism / performance / precision flags (Megatron-LM's names and defaults,
with slime's overrides), slime's Megatron hooks and kernel choices; the parallel sizes' checks and derived
defaults. The FSDP trainer reads the backend-neutral ones (precision, dynamic batching, recompute granularity)
and says which Megatron-only ones change nothing for it (trainer_fsdp.py).
"""
from __future__ import annotations

from slime_like.config.checkpoint import is_fsdp_checkpoint
from slime_like.config.errors import ConfigError
from slime_like.config.types import json_value
from slime_like.registry import TRAINER_BACKENDS
from slime_like.config.types import Int, json_value


def add_perf_group(parser):
    g = parser.add_argument_group("perf/parallelism",
                                  "Megatron parallelism, recomputation, dynamic batching and precision")
    a = g.add_argument
    a("--tensor-model-parallel-size", type=Int(1), default=1, help="Tensor parallel size (TP).")
    a("--pipeline-model-parallel-size", type=Int(1), default=1, help="Pipeline parallel size (PP).")
    a("--context-parallel-size", type=Int(1), default=1,
      help="Context parallel size (CP). With --train-backend fsdp: Ulysses sequence parallelism over this many ranks "
           "of each data-parallel replica (docs/backends.md).")
    a("--expert-model-parallel-size", type=Int(1), default=1, help="Expert parallel size (EP).")
    a("--expert-tensor-parallel-size", type=Int(1), default=None, help="Expert tensor parallel size; default = TP.")
    a("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs TP > 1).")
    a("--num-layers-per-virtual-pipeline-stage", type=Int(1), default=None,
      help="Interleaved pipeline schedule: layers per model chunk (even split only).")
    a("--num-virtual-stages-per-pipeline-rank", type=Int(1), default=None,
      help="Interleaved pipeline schedule: model chunks per pipeline rank.")
    a("--decoder-first-pipeline-num-layers", type=Int(0), default=None, help="Layers on the first pipeline stage.")
    a("--decoder-last-pipeline-num-layers", type=Int(0), default=None, help="Layers on the last pipeline stage.")
    a("--account-for-embedding-in-pipeline-split", action="store_true", help="Count the embedding as a layer.")
    a("--account-for-loss-in-pipeline-split", action="store_true", help="Count the loss as a layer.")
    a("--allgather-cp", action="store_true",
      help="Context parallelism as slime's DeepSeek-V3.2 / GLM-5 layout: the packed samples cut into CP contiguous "
           "pieces (not Megatron's 2 x CP chunks per sample), keys and values all-gathered. DSA models only.")
    a("--cp-comm-type", nargs="+", default=["p2p"], choices=["p2p", "a2a", "allgather", "a2a+p2p"],
      help="Context-parallel communication type.")
    a("--use-distributed-optimizer", action="store_true", help="Shard optimizer state across data-parallel ranks.")
    a("--overlap-grad-reduce", action="store_true", help="Overlap gradient reduce-scatter with backward.")
    a("--overlap-param-gather", action="store_true", help="Overlap parameter all-gather with forward.")
    a("--distributed-backend", default="nccl", choices=["nccl", "gloo"],
      help="torch.distributed backend for the trainers (gloo is used automatically on CPU).")
    a("--distributed-timeout-minutes", type=Int(1), default=10, help="torch.distributed timeout (minutes).")
    a("--recompute-granularity", default=None, choices=["full", "selective"], help="Activation recomputation.")
    a("--recompute-method", default=None, choices=["uniform", "block"], help="How layers are recomputed.")
    a("--recompute-num-layers", type=Int(1), default=None, help="Layers per recompute unit.")
    a("--recompute-modules", nargs="*", default=None, help="Modules to recompute with selective granularity.")
    a("--recompute-loss-function", action="store_true", help="Recompute the loss function to save memory (slime).")
    a("--use-dynamic-batch-size", action="store_true",
      help="Pack micro-batches by token count (up to --max-tokens-per-gpu) instead of --micro-batch-size.")
    a("--shared-prompt-training", action="store_true",
      help="(slime_like's own flag, not slime's) Megatron trainer: compute each group's shared prompt once per "
           "micro-batch ([prompt, response_1, ..., response_n] in one row with a shared-prefix attention mask and "
           "per-token RoPE positions); same log-probs and gradients, fewer tokens. Local / SDPA attention only.")
    a("--max-tokens-per-gpu", type=Int(1), default=None,
      help="Token budget per GPU per micro-batch (dynamic batching).")
    a("--log-probs-max-tokens-per-gpu", type=Int(1), default=None,
      help="Token budget for log-prob forward passes; default = --max-tokens-per-gpu.")
    a("--log-probs-chunk-size", type=Int(-1), default=-1, help="Chunk size for log-prob computation; -1 = no chunking.")
    a("--balance-data", action="store_true",
      help="Balance tokens across data-parallel ranks (karmarkar-karp partitioning).")
    a("--bf16", action="store_true", help="bfloat16 parameters and compute.")
    a("--fp16", action="store_true", help="float16 parameters and compute (with loss scaling).")
    a("--fp8-format", default=None, choices=["e4m3", "hybrid"], help="FP8 training format (TransformerEngine, CUDA).")
    a("--fp8-recipe", default="delayed", choices=["tensorwise", "delayed", "mxfp8", "blockwise"],
      help="FP8 scaling recipe (TransformerEngine, CUDA).")
    a("--fp8-param-gather", action="store_true", help="Keep parameters in FP8 for the all-gather (CUDA).")
    a("--attention-softmax-in-fp32", action="store_true", help="Attention softmax in fp32.")
    a("--accumulate-allreduce-grads-in-fp32", action="store_true", help="fp32 gradient accumulation and reduce.")
    a("--attention-backend", default="auto", choices=["flash", "fused", "unfused", "local", "auto"],
      help="Attention kernel backend (Megatron AttnBackend).")
    a("--use-flash-attn", action="store_true", help="FlashAttention (CUDA).")
    a("--transformer-impl", default="transformer_engine", choices=["local", "transformer_engine"],
      help="Megatron layer implementation; the CPU backend uses the local one.")
    a("--no-gradient-accumulation-fusion", action="store_false", dest="gradient_accumulation_fusion",
      help="Disable fused weight-gradient accumulation (needs a CUDA extension).")
    a("--no-masked-softmax-fusion", action="store_false", dest="masked_softmax_fusion", help="Unfused masked softmax.")
    a("--no-bias-swiglu-fusion", action="store_false", dest="bias_swiglu_fusion", help="Unfused bias+SwiGLU.")
    a("--no-bias-dropout-fusion", action="store_false", dest="bias_dropout_fusion", help="Unfused bias+dropout.")
    a("--use-precision-aware-optimizer", action="store_true", help="TransformerEngine precision-aware optimizer.")
    a("--optimizer-cpu-offload", action="store_true", help="Keep optimizer state on CPU.")
    a("--overlap-cpu-optimizer-d2h-h2d", action="store_true",
      help="Overlap the device<->host copies of --optimizer-cpu-offload with compute.")
    a("--deterministic-mode", action="store_true",
      help="Deterministic algorithms only (torch.use_deterministic_algorithms; megatron-core's deterministic mode).")
    a("--no-check-for-nan-in-loss-and-grad", action="store_false", dest="check_for_nan_in_loss_and_grad",
      help="Do not stop on a NaN/Inf gradient (megatron-core DDP's check; on by default as in Megatron-LM).")
    a("--enable-experimental", action="store_true", help="Allow megatron-core's experimental features.")
    a("--train-env-vars", type=json_value, default="{}",
      help="JSON dict of environment variables for the trainer processes, merged over ours; its OMP_NUM_THREADS "
           "(else the environment's) sets each rank's torch threads.")
    return parser


def add_hook_flags(g):
    """(slime extras group) custom code called by the Megatron trainer or the rollout."""
    a = g.add_argument
    a("--custom-megatron-init-path", default=None, help="'module.function' called after Megatron initialises.")
    a("--custom-megatron-before-log-prob-hook-path", default=None,
      help="'module.function' called before each log-prob pass.")
    a("--custom-megatron-before-train-step-hook-path", default=None,
      help="'module.function' called before each train step.")
    a("--custom-pg-loss-reducer-function-path", default=None, help="'module.function' reducing the policy loss only.")


def add_batching_flags(g):
    """(slime extras group) optimizer / batching."""
    a = g.add_argument
    a("--balance-by-flops", action="store_true", help="Partition micro-batches by estimated FLOPs, not tokens.")
    a("--data-pad-size-multiplier", type=Int(1), default=128, help="Pad packed sequences to a multiple of this.")


def add_kernel_flags(g):
    """(slime extras group) kernels."""
    a = g.add_argument
    a("--megatron-deepgemm-forward-layers", nargs="+", type=Int(0), default=None,
      help="Layers whose linears use SGLang's block-FP8 DeepGEMM forward.")
    a("--megatron-deepgemm-forward-modules", nargs="+", default=None, help="Module suffixes for the DeepGEMM forward.")
    a("--megatron-deepgemm-moe-forward-layers", nargs="+", type=Int(0), default=None,
      help="MoE layers whose grouped MLP uses DeepGEMM.")
    a("--megatron-deepgemm-moe-forward-modules", nargs="+", default=None, help="Grouped-MLP module suffixes.")
    a("--qwen-gdn-backend", default="fla", choices=["fla", "flashqla"], help="Gated-delta-net kernel backend.")


def check_megatron_backend(args, report):
    """--train-backend megatron's own checks (its registry validator): checkpoints it cannot read."""
    for dest, flag in (("load", "--load"), ("ref_load", "--ref-load"), ("critic_load", "--critic-load")):
        path = getattr(args, dest, None)
        if path and is_fsdp_checkpoint(path):
            raise ConfigError(f"{flag} {path} is a --train-backend fsdp (DCP) checkpoint; the Megatron trainer "
                              "reads torch_dist and HF directories: add --train-backend fsdp, or export HF "
                              "weights with --save-hf and load those")


def check_keep_old_actor(args, report):
    keepers = TRAINER_BACKENDS.with_capability("keeps_pushed_weights")
    if args.keep_old_actor and not TRAINER_BACKENDS.has(args.train_backend, "keeps_pushed_weights"):
        report.refuse(f"--keep-old-actor with --train-backend {args.train_backend}: only "
                      f"{' / '.join(map(TRAINER_BACKENDS.display, keepers))} keeps the pushed weights; use "
                      f"--train-backend {' or '.join(keepers)}")
    if args.keep_old_actor and args.use_rollout_logprobs:
        raise ConfigError("--keep-old-actor scores the old policy with the pushed weights, --use-rollout-logprobs "
                          "takes the engine's log-probs as the old policy instead: use one of them")


def check_precision(args, gpu_visible: bool):
    """--bf16 / --fp16, and slime's defaults on a GPU machine: slime's _set_default_megatron_args sets
    `bf16 = not fp16` and the distributed optimizer, so its recipes (which never pass --bf16) train in bf16 with
    ZeRO-sharded optimizer state. Here the same on a machine that shows an NVIDIA GPU, for both trainers (the FSDP
    trainer's default policy follows --bf16; it shards its optimizer state anyway); a CPU run keeps fp32 unless
    asked. RLinf / ROLL precision keys become --bf16 / --fp16 in their front-ends, so this applies to them too.
    gpu_visible: cluster.cuda_visible() (passed in: cluster.py imports this module)."""
    if args.bf16 and args.fp16:
        raise ConfigError("--bf16 and --fp16 exclude each other; choose one")
    if not gpu_visible:
        return
    if not args.fp16:
        args.bf16 = True
    if TRAINER_BACKENDS.has(args.train_backend, "distributed_optimizer"):
        args.use_distributed_optimizer = True


def check_fp8(args, report, gpu_visible: bool) -> None:
    """--fp8-format / --fp8-recipe / --fp8-param-gather: TransformerEngine's FP8 in the Megatron trainer's layers.
    Invalid anywhere: FP8 with another trainer, the parameter gather without a format. Valid on GPUs but not here:
    a machine that shows no GPU (refused at launch). The trainers check TransformerEngine and the GPU's compute
    capability when they build the model (backends/megatron/kernels.py, transformer_config.py)."""
    fmt = args.fp8_format
    if args.fp8_param_gather and not fmt:
        raise ConfigError("--fp8-param-gather keeps FP8 parameters, but no --fp8-format is set: add --fp8-format "
                          "e4m3 (or hybrid), or drop it")
    if "fp8_recipe" in args.cli_dests and not fmt:
        raise ConfigError(f"--fp8-recipe {args.fp8_recipe} without --fp8-format: add --fp8-format e4m3 (or hybrid) "
                          "to train in FP8, or drop it")
    if not fmt:
        return
    if not TRAINER_BACKENDS.has(args.train_backend, "megatron_core_spec"):
        raise ConfigError(f"--fp8-format {fmt} is FP8 training through TransformerEngine's layers in the Megatron "
                          f"trainer; --train-backend {args.train_backend} does not build them: use --train-backend "
                          "megatron or drop it")
    if not gpu_visible:
        report.refuse(f"--fp8-format {fmt} --fp8-recipe {args.fp8_recipe}: FP8 training needs TransformerEngine on "
                      "a GPU with FP8 (compute capability 8.9+: Ada, Hopper, Blackwell; mxfp8 Blackwell); this "
                      "machine shows none. Run it on such GPUs, or drop the FP8 flags (bf16)")


def precision_line(args) -> str:
    """The dry run's one line: the compute precision each trainer will use, and why."""
    dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    named = {"bf16", "fp16"} & set(args.cli_dests)
    if named:
        why = f"--{sorted(named)[0]} on the command line"
    elif dtype == "bf16":
        why = "a GPU is visible: slime's default (bf16 unless --fp16)"
    else:
        why = "no GPU visible: fp32 unless --bf16 / --fp16"
    sharded = TRAINER_BACKENDS.has(args.train_backend, "fp32_sharded_params")
    if sharded and dtype != "fp32":
        detail = f"{dtype} compute over fp32 sharded parameters (FSDP2 mixed precision)"
    elif sharded:
        detail = "fp32"
    else:
        detail = dtype + (" parameters, fp32 main weights in the optimizer" if dtype != "fp32" else "") + \
            (", distributed optimizer" if args.use_distributed_optimizer else "")
    return f"  precision             = {detail} ({why})"


def check_parallel_sizes(args, report):
    """-> (tp, pp, cp, ep, etp), the expert TP defaulted to TP and sequence parallelism off without TP."""
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    ep = args.expert_model_parallel_size
    if min(tp, pp, cp, ep) < 1:
        raise ConfigError(f"parallel sizes must be >= 1: --tensor-model-parallel-size {tp}, --pipeline-model-parallel-size "
                          f"{pp}, --context-parallel-size {cp}, --expert-model-parallel-size {ep}")
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = tp  # Megatron's default
    etp = args.expert_tensor_parallel_size
    if args.sequence_parallel and tp == 1:  # Megatron-LM turns it off the same way (it splits over the TP group)
        args.sequence_parallel = False
        report.warn("--sequence-parallel with --tensor-model-parallel-size 1: turned off, as Megatron-LM does "
                    "(sequence parallelism splits activations over the tensor-parallel group)")
    return tp, pp, cp, ep, etp


# Per-token pieces of the loss that need a whole response on one rank: under CP each rank holds part of it
CP_WHOLE_RESPONSE = (
    ("custom_loss_function_path", "--custom-loss-function-path", "the custom loss is handed whole responses"),
    ("custom_tis_function_path", "--custom-tis-function-path", "the custom TIS function is handed whole responses"),
    ("custom_pg_loss_reducer_function_path", "--custom-pg-loss-reducer-function-path",
     "the custom reducer is handed whole responses"),
    ("early_stop_imp_ratio", "--early-stop-imp-ratio", "its per-micro-batch stop would differ between CP ranks"),
    ("use_routing_replay", "--use-routing-replay", "the recorded routing is per whole sequence"),
    ("use_rollout_routing_replay", "--use-rollout-routing-replay", "the recorded routing is per whole sequence"),
)


def check_context_parallel(args, report, cp: int) -> None:
    """--context-parallel-size > 1 (backends/training/cp_layout.py): the combinations the split loss cannot run,
    refused at launch (the dry run lists them). GSPO's and OPSM's per-sequence means are all-reduced over CP; the
    gated delta net layers of Qwen3-Next / Qwen3.5 gather whole samples over CP (backends/megatron/gated_delta_net.py)."""
    if cp == 1 or not TRAINER_BACKENDS.has(args.train_backend, "cp_splits_responses"):
        return  # the FSDP trainer's Ulysses shards run inside the model; its loss sees whole responses
    for dest, flag, why in CP_WHOLE_RESPONSE:
        if getattr(args, dest, None):
            report.launch_refusals.append(f"--context-parallel-size {cp} with {flag}: {why}, while context "
                                          "parallelism splits responses over CP ranks; use --context-parallel-size 1")


def check_model_divisibility(args, tp, pp, ep):
    """Heads over TP, layers over PP, experts over EP."""
    if args.num_attention_heads:
        if args.num_attention_heads % tp:
            raise ConfigError(f"--num-attention-heads {args.num_attention_heads} not divisible by "
                              f"--tensor-model-parallel-size {tp}")
        if args.group_query_attention and args.num_query_groups % tp:
            raise ConfigError(f"--num-query-groups {args.num_query_groups} not divisible by --tensor-model-parallel-size {tp}")
    if args.num_layers:
        problem = pipeline_split_problem(args.num_layers, pp, args.decoder_first_pipeline_num_layers,
                                         args.decoder_last_pipeline_num_layers)
        if problem:
            raise ConfigError(problem)
        check_virtual_pipeline(args, pp)
    if args.num_experts and args.num_experts % ep:
        raise ConfigError(f"--num-experts {args.num_experts} not divisible by EP {ep}")


def pipeline_split_problem(num_layers: int, pp: int, first, last) -> str | None:
    """What is wrong with splitting `num_layers` over `pp` stages, the first / last holding `first` / `last` layers
    (--decoder-first/last-pipeline-num-layers, megatron-core's num_layers_in_first/last_pipeline_stage; None: an even
    share), or None. The middle stages share the rest evenly, as megatron-core requires."""
    uneven = [(f, n) for f, n in (("--decoder-first-pipeline-num-layers", first),
                                  ("--decoder-last-pipeline-num-layers", last)) if n is not None]
    if not uneven:
        if pp > 1 and num_layers % pp:
            return (f"--num-layers {num_layers} not divisible by --pipeline-model-parallel-size {pp}; set "
                    "--decoder-first/last-pipeline-num-layers for an uneven split")
        return None
    if pp == 1:
        return (f"{uneven[0][0]} {uneven[0][1]} splits the layers over pipeline stages, but "
                "--pipeline-model-parallel-size is 1; drop it or raise the pipeline size")
    for flag, n in uneven:
        if n <= 0:
            return f"{flag} {n} must be at least 1"
    rest, middle = num_layers - sum(n for _, n in uneven), pp - len(uneven)
    given = ", ".join(f"{f} {n}" for f, n in uneven)
    if rest < 0 or (middle == 0 and rest) or (middle and (rest == 0 or rest % middle)):
        return (f"{given} leave {rest} of --num-layers {num_layers} for the {middle} other stage(s) of "
                f"--pipeline-model-parallel-size {pp}: each other stage needs the same number (at least 1)")
    return None


def check_virtual_pipeline(args, pp: int) -> None:
    """The interleaved schedule's flags (--num-layers-per-virtual-pipeline-stage or
    --num-virtual-stages-per-pipeline-rank): one of them, PP > 1, and every stage's layers divide evenly into its
    chunks, as megatron-core needs."""
    per_layer, per_rank = args.num_layers_per_virtual_pipeline_stage, args.num_virtual_stages_per_pipeline_rank
    if per_layer is None and per_rank in (None, 1):  # one chunk per rank: the plain 1F1B schedule
        return
    problem = virtual_pipeline_problem(args.num_layers, pp, per_layer, per_rank, args.decoder_first_pipeline_num_layers,
                                       args.decoder_last_pipeline_num_layers)
    if problem:
        raise ConfigError(problem)


def virtual_pipeline_problem(num_layers: int, pp: int, per_layer, per_rank, first=None, last=None) -> str | None:
    """What is wrong with the interleaved split, or None (the stage split itself is pipeline_split_problem's)."""
    if per_layer is None and per_rank in (None, 1):
        return None
    if per_layer is not None and per_rank is not None:
        return ("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank both set the "
                "interleaved schedule; pass one of them")
    flag, value = (("--num-layers-per-virtual-pipeline-stage", per_layer) if per_layer is not None
                   else ("--num-virtual-stages-per-pipeline-rank", per_rank))
    if pp == 1:
        return f"{flag} {value} interleaves pipeline stages, but --pipeline-model-parallel-size is 1"
    if per_layer is not None:
        if first is not None or last is not None:
            return (f"{flag} {value} with --decoder-first/last-pipeline-num-layers: an uneven split takes "
                    "--num-virtual-stages-per-pipeline-rank instead (as Megatron-LM)")
        if (num_layers // pp) % per_layer:
            return (f"{flag} {value} does not divide the {num_layers // pp} layers of each of the {pp} pipeline "
                    f"stages (--num-layers {num_layers})")
        return None
    stages = {"first": first, "last": last}
    rest = num_layers - sum(n for n in stages.values() if n is not None)
    middle = pp - sum(n is not None for n in stages.values())
    sizes = [n for n in stages.values() if n is not None] + ([rest // middle] if middle else [])
    if any(n % value for n in sizes):
        return (f"{flag} {value}: the pipeline stages hold {sorted(set(sizes))} layers (--num-layers {num_layers} over "
                f"--pipeline-model-parallel-size {pp}); each stage's layers must divide evenly into {value} chunks")
    return None


def check_shared_prompt(args) -> None:
    """--shared-prompt-training: what the layout (backends/training/shared_prompt.py) does not cover, all at once.
    The machine's part (TransformerEngine in use) is the Megatron trainer's launch check."""
    if not args.shared_prompt_training:
        return
    from slime_like.config.hf_families import family_of

    flag = "--shared-prompt-training"
    problems = []
    if not TRAINER_BACKENDS.has(args.train_backend, "shares_prompts"):
        problems.append(f"{flag} with --train-backend {args.train_backend}: "
                        f"{TRAINER_BACKENDS.display(args.train_backend)} does not build the shared-prompt layout; use "
                        f"--train-backend {' or '.join(TRAINER_BACKENDS.with_capability('shares_prompts'))} or drop "
                        "the flag")
    if args.context_parallel_size > 1:
        problems.append(f"{flag} with --context-parallel-size {args.context_parallel_size}: not supported; set "
                        "--context-parallel-size 1 or drop the flag")
    if args.enable_mtp_training:
        problems.append(f"{flag} with --enable-mtp-training: MTP layers read whole rows; drop one of the two")
    if args.use_routing_replay or args.use_rollout_routing_replay:
        problems.append(f"{flag} with --use-routing-replay / --use-rollout-routing-replay: the recorded routing "
                        "is per token of ordinary rows; drop one of them")
    if args.hf_model_type and family_of({"model_type": args.hf_model_type}).vision_language:
        problems.append(f"{flag}: the model ({args.hf_model_type}) is a vision-language model, not supported; "
                        "drop the flag")
    if problems:
        raise ConfigError("; ".join(problems))

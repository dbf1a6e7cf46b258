"""Megatron settings as RLinf (actor.model / optim / lr_sched / megatron) and ROLL (strategy_config of
megatron_train / megatron_infer) write them, mapped onto our Megatron flags.

A key that names one of our Megatron flags becomes that flag, so the flag's own rules apply (support.py
refuses what the trainer cannot do, warns about what changes nothing here). Keys without a flag of ours are
NoEffect (kernel fusions, communication overlap: same results) or Refuse (a different model or schedule).
"""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.frontends.common import Free, Map, NoEffect, Read, Refuse, flag_rule

_FUSION = "a kernel fusion / memory choice of megatron-core; the results are the same without it"
_CONVERTER = ("RLinf's checkpoint converter; the trainer loads the HF weights of --hf-checkpoint directly "
              "(tools/convert_hf_to_megatron.py converts offline)")


def val(flag):
    return flag_rule(flag, lambda v, t: t.flag(flag, v))


def on(flag):
    return flag_rule(flag, lambda v, t: t.switch(flag, bool(v)))


def off(flag):
    """A store_false flag: written when the YAML value is false."""
    return flag_rule(flag, lambda v, t: t.switch(flag, not v))


def _precision(v, t):
    table = {"fp16": "--fp16", "float16": "--fp16", "16": "--fp16", "bf16": "--bf16", "bfloat16": "--bf16",
             "fp32": None, "float32": None, "32": None}
    key = str(v).lower()
    if key not in table:
        raise ConfigError(f"{v!r}: use fp32, bf16 or fp16")
    if table[key]:
        t.flag(table[key])


def _activation(v, t):
    if v not in ("swiglu", "gelu"):
        raise ConfigError(f"{v!r}: the trainer builds swiglu or gelu MLPs")
    t.switch("--swiglu", v == "swiglu")


def _norm(v, t):
    table = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
    if str(v).lower() not in table:
        raise ConfigError(f"{v!r}: use rmsnorm or layernorm")
    t.flag("--normalization", table[str(v).lower()])


def _seq_parallel(v, t):
    t.facts["sequence_parallel"] = bool(v)
    t.facts["sequence_parallel_key"] = "actor.model.sequence_parallel" if t.fmt == "rlinf" else \
        "actor_train.strategy_args.strategy_config.sequence_parallel"


RLINF_MODEL = {
    "precision": Map("num_or_str", _precision),
    "add_bias_linear": Map("bool", off("--disable-bias-linear")),
    "tensor_model_parallel_size": Map("int", val("--tensor-model-parallel-size")),
    "pipeline_model_parallel_size": Map("int", val("--pipeline-model-parallel-size")),
    "context_parallel_size": Map("int", val("--context-parallel-size")),
    "expert_model_parallel_size": Map("int", val("--expert-model-parallel-size")),
    "activation": Map("str", _activation),
    "sequence_parallel": Map("bool", _seq_parallel),
    "recompute_method": Map("str", val("--recompute-method")),
    "recompute_granularity": Map("str", val("--recompute-granularity")),
    "recompute_num_layers": Map("int", val("--recompute-num-layers")),
    "seq_length": Map("int", val("--seq-length")),
    "encoder_seq_length": NoEffect("int", "decoder-only models: runner.seq_length is the length that counts"),
    "normalization": Map("str", _norm),
    "position_embedding_type": Map("str", val("--position-embedding-type")),
    "apply_rope_fusion": Map("bool", off("--no-rope-fusion")),
    "bias_dropout_fusion": Map("bool", off("--no-bias-dropout-fusion")),
    "persist_layer_norm": NoEffect("bool", _FUSION),
    "bias_activation_fusion": Map("bool", off("--no-bias-swiglu-fusion")),
    "attention_softmax_in_fp32": Map("bool", on("--attention-softmax-in-fp32")),
    "batch_p2p_comm": NoEffect("bool", "pipeline send/recv batching: same results"),
    "variable_seq_lengths": NoEffect("bool", "micro-batches always carry their own lengths (packed sequences)",
                                     harmless=(True,)),
    "gradient_accumulation_fusion": Map("bool", off("--no-gradient-accumulation-fusion")),
    "moe_token_dispatcher_type": Map("str", val("--moe-token-dispatcher-type")),
    "use_cpu_initialization": NoEffect("bool", "weights are initialised from the HF checkpoint"),
}

RLINF_OPTIM = {
    "optimizer": Map("str", val("--optimizer")),
    "bf16": Map("bool", on("--bf16")),
    "fp16": Map("bool", on("--fp16")),
    "lr": Map("float", val("--lr")),
    "adam_beta1": Map("float", val("--adam-beta1")),
    "adam_beta2": Map("float", val("--adam-beta2")),
    "adam_eps": Map("float", val("--adam-eps")),
    "min_lr": NoEffect("float", "the schedule's floor is actor.lr_sched.min_lr (Megatron's --min-lr)"),
    "weight_decay": Map("float", val("--weight-decay")),
    "use_distributed_optimizer": Map("bool", on("--use-distributed-optimizer")),
    "overlap_grad_reduce": Map("bool", on("--overlap-grad-reduce")),
    "overlap_param_gather": Map("bool", on("--overlap-param-gather")),
    "optimizer_enable_pin": NoEffect("bool", _FUSION, harmless=(False,)),
    "overlap_param_gather_with_optimizer_step": NoEffect("bool", _FUSION, harmless=(False,)),
    "clip_grad": Map("float", val("--clip-grad")),
    "loss_scale_window": NoEffect("num_or_str", "fp16 dynamic loss scaling keeps megatron-core's defaults"),
    "initial_loss_scale": NoEffect("num_or_str", "fp16 dynamic loss scaling keeps megatron-core's defaults"),
    "loss_scale": Map("float", val("--loss-scale")),
}


def _max_lr(v, t):
    t.facts["max_lr"] = v


RLINF_LR_SCHED = {
    "lr_warmup_fraction": Map("float", val("--lr-warmup-fraction")),
    "lr_warmup_init": Map("float", val("--lr-warmup-init")),
    "lr_warmup_iters": Map("int", val("--lr-warmup-iters")),
    "max_lr": Map("float", _max_lr),
    "min_lr": Map("float", val("--min-lr")),
    "lr_decay_style": Map("str", val("--lr-decay-style")),
    "lr_decay_iters": Map("int", val("--lr-decay-iters")),
}

RLINF_MEGATRON = {
    "ddp_bucket_size": NoEffect("int", _FUSION),
    "distributed_backend": Map("str", val("--distributed-backend")),
    "distributed_timeout_minutes": Map("int", val("--distributed-timeout-minutes")),
    "ckpt_format": NoEffect("str", "checkpoints are written and read as torch_dist", harmless=("torch_dist",)),
    "use_dist_ckpt": NoEffect("bool", "checkpoints are always distributed (torch_dist)", harmless=(True,)),
    "tp_comm_bootstrap_backend": NoEffect("str", "TP communication overlap is not wired", harmless=("nccl",)),
    "tp_comm_overlap_cfg": Refuse("str", "TP communication overlap is not wired", ok=(None,)),
    "use_hf_ckpt": Refuse("bool", "the trainer initialises from the HF checkpoint (--hf-checkpoint); a Megatron "
                                  "checkpoint to resume is actor.checkpoint_load_path (--load)", ok=(True,)),
    "ckpt": Free(NoEffect("any", _CONVERTER)),
    "ckpt_convertor": Free(NoEffect("any", _CONVERTER)),
    "use_profiler": NoEffect("bool", "torch profiler traces are not written; use py-spy or torch.profiler around "
                                     "train.py", harmless=(False,)),
    "profiler": Free(NoEffect("any", "read only with actor.megatron.use_profiler: true")),
}

# ROLL strategy_config of megatron_train / megatron_infer.
ROLL_MEGATRON = {
    "tensor_model_parallel_size": Map("int", val("--tensor-model-parallel-size")),
    "pipeline_model_parallel_size": Map("int", val("--pipeline-model-parallel-size")),
    "expert_model_parallel_size": Map("int", val("--expert-model-parallel-size")),
    "context_parallel_size": Map("int", val("--context-parallel-size")),
    "virtual_pipeline_model_parallel_size": Map("int", val("--num-virtual-stages-per-pipeline-rank")),
    "sequence_parallel": Map("bool", _seq_parallel),
    "recompute_granularity": Map("str", val("--recompute-granularity")),
    "moe_layer_recompute": NoEffect("bool", _FUSION),
    "moe_token_dispatcher_type": Map("str", val("--moe-token-dispatcher-type")),
    "moe_grouped_gemm": Map("bool", on("--moe-grouped-gemm")),
    "moe_shared_expert_overlap": Map("bool", on("--moe-shared-expert-overlap")),
    "overlap_grad_reduce": Map("bool", on("--overlap-grad-reduce")),
    "use_distributed_optimizer": Map("bool", on("--use-distributed-optimizer")),
    "bias_activation_fusion": NoEffect("bool", _FUSION),
    "apply_rope_fusion": NoEffect("bool", _FUSION),
}

# Keys of ROLL's megatron_infer (the reference worker): its parallel layout is the actor's here.
ROLL_MEGATRON_INFER = {key: Read(rule.typ, "the reference runs with the actor's parallel layout")
                       for key, rule in ROLL_MEGATRON.items()}


def finish(t) -> None:
    """Cross-key Megatron checks once the whole file is read."""
    max_lr = t.facts.get("max_lr")
    lr = next((t.tokens[i + 1] for i in range(len(t.tokens) - 1) if t.tokens[i] == "--lr"), None)
    if max_lr is not None and lr is not None and float(lr) != float(max_lr):
        raise ConfigError(f"{t.path}: actor.lr_sched.max_lr {max_lr} differs from actor.optim.lr {lr}: the peak "
                          "learning rate is one value here (--lr); make them equal")
    if max_lr is not None and lr is None:
        t.flag("--lr", max_lr)
    if t.facts.get("sequence_parallel"):
        tp = next((int(t.tokens[i + 1]) for i in range(len(t.tokens) - 1)
                   if t.tokens[i] == "--tensor-model-parallel-size"), 1)
        if tp > 1:
            t.flag("--sequence-parallel")
        else:
            t.no_effect.append((t.facts["sequence_parallel_key"], True, "tensor parallelism is 1, so there is nothing to split"))

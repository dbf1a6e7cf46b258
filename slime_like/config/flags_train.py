"""Trainer flags: parallelism / performance, precision, optimizer & LR schedule, checkpoints.

Names, dests and defaults follow Megatron-LM (megatron/training/arguments.py) with slime's overrides
(slime/utils/arguments.py `reset_arg`: lr 1e-6, clip_grad 1.0, seed 1234, micro_batch_size 1, ...).
"""
from __future__ import annotations

from slime_like.config.types import json_value


def add_perf_group(parser):
    g = parser.add_argument_group("perf/parallelism",
                                  "Megatron parallelism, recomputation, dynamic batching and precision")
    a = g.add_argument
    a("--tensor-model-parallel-size", type=int, default=1, help="Tensor parallel size (TP).")
    a("--pipeline-model-parallel-size", type=int, default=1, help="Pipeline parallel size (PP).")
    a("--context-parallel-size", type=int, default=1, help="Context parallel size (CP).")
    a("--expert-model-parallel-size", type=int, default=1, help="Expert parallel size (EP).")
    a("--expert-tensor-parallel-size", type=int, default=None, help="Expert tensor parallel size; default = TP.")
    a("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs TP > 1).")
    a("--num-layers-per-virtual-pipeline-stage", type=int, default=None, help="Interleaved pipeline schedule.")
    a("--decoder-first-pipeline-num-layers", type=int, default=None, help="Layers on the first pipeline stage.")
    a("--decoder-last-pipeline-num-layers", type=int, default=None, help="Layers on the last pipeline stage.")
    a("--account-for-embedding-in-pipeline-split", action="store_true", help="Count the embedding as a layer.")
    a("--account-for-loss-in-pipeline-split", action="store_true", help="Count the loss as a layer.")
    a("--cp-comm-type", nargs="+", default=["p2p"], choices=["p2p", "a2a", "allgather", "a2a+p2p"],
      help="Context-parallel communication type.")
    a("--use-distributed-optimizer", action="store_true", help="Shard optimizer state across data-parallel ranks.")
    a("--overlap-grad-reduce", action="store_true", help="Overlap gradient reduce-scatter with backward.")
    a("--overlap-param-gather", action="store_true", help="Overlap parameter all-gather with forward.")
    a("--distributed-backend", default="nccl", choices=["nccl", "gloo"],
      help="torch.distributed backend for the trainers (gloo is used automatically on CPU).")
    a("--distributed-timeout-minutes", type=int, default=10, help="torch.distributed timeout (minutes).")
    a("--recompute-granularity", default=None, choices=["full", "selective"], help="Activation recomputation.")
    a("--recompute-method", default=None, choices=["uniform", "block"], help="How layers are recomputed.")
    a("--recompute-num-layers", type=int, default=None, help="Layers per recompute unit.")
    a("--recompute-modules", nargs="*", default=None, help="Modules to recompute with selective granularity.")
    a("--recompute-loss-function", action="store_true", help="Recompute the loss function to save memory (slime).")
    a("--use-dynamic-batch-size", action="store_true",
      help="Pack micro-batches by token count (up to --max-tokens-per-gpu) instead of --micro-batch-size.")
    a("--max-tokens-per-gpu", type=int, default=None, help="Token budget per GPU per micro-batch (dynamic batching).")
    a("--log-probs-max-tokens-per-gpu", type=int, default=None,
      help="Token budget for log-prob forward passes; default = --max-tokens-per-gpu.")
    a("--log-probs-chunk-size", type=int, default=-1, help="Chunk size for log-prob computation; -1 = no chunking.")
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
    a("--train-env-vars", type=json_value, default="{}", help="JSON dict of environment variables for trainer processes.")
    return parser


def add_optimizer_group(parser):
    g = parser.add_argument_group("optimizer & LR schedule", "Optimizer and learning-rate schedule (Megatron flags)")
    a = g.add_argument
    a("--optimizer", default="adam", choices=["adam", "sgd"], help="Optimizer.")
    a("--lr", type=float, default=1e-6, help="Peak learning rate (slime default 1e-6).")
    a("--min-lr", type=float, default=0.0, help="Floor of the decayed learning rate.")
    a("--lr-decay-style", default="linear", choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
      help="Learning-rate decay schedule (Megatron default linear).")
    a("--lr-decay-iters", type=int, default=None, help="Optimizer steps to decay over; default = all steps.")
    a("--lr-warmup-iters", type=int, default=0, help="Linear warmup steps.")
    a("--lr-warmup-fraction", type=float, default=None, help="Warmup as a fraction of --lr-decay-iters.")
    a("--lr-warmup-init", type=float, default=0.0, help="Learning rate at the start of warmup.")
    a("--lr-wsd-decay-style", default="exponential", choices=["exponential", "linear", "cosine"],
      help="Decay style of the WSD schedule's final phase.")
    a("--lr-wsd-decay-iters", type=int, default=None, help="Steps of the WSD decay phase.")
    a("--weight-decay", type=float, default=0.01, help="Weight decay (Megatron default 0.01).")
    a("--start-weight-decay", type=float, default=None, help="Initial weight decay for an increasing schedule.")
    a("--end-weight-decay", type=float, default=None, help="Final weight decay for an increasing schedule.")
    a("--weight-decay-incr-style", default="constant", choices=["constant", "linear", "cosine"],
      help="Weight-decay schedule.")
    a("--clip-grad", type=float, default=1.0, help="Global gradient-norm clip (slime default 1.0).")
    a("--adam-beta1", type=float, default=0.9, help="Adam beta1.")
    a("--adam-beta2", type=float, default=0.999, help="Adam beta2.")
    a("--adam-eps", type=float, default=1e-8, help="Adam epsilon.")
    a("--sgd-momentum", type=float, default=0.9, help="SGD momentum.")
    a("--loss-scale", type=float, default=None, help="Static loss scale for fp16; None = dynamic.")
    a("--initial-loss-scale", type=float, default=2 ** 32, help="Initial dynamic loss scale (fp16).")
    a("--min-loss-scale", type=float, default=1.0, help="Minimum dynamic loss scale (fp16).")
    a("--loss-scale-window", type=float, default=1000, help="Steps between dynamic loss-scale increases.")
    a("--hysteresis", type=int, default=2, help="Dynamic loss-scale hysteresis.")
    a("--override-opt_param-scheduler", action="store_true", dest="override_opt_param_scheduler",
      help="Ignore the scheduler state stored in the checkpoint.")
    a("--use-checkpoint-opt_param-scheduler", action="store_true", dest="use_checkpoint_opt_param_scheduler",
      help="Take the scheduler settings from the checkpoint.")
    a("--train-iters", type=int, default=None, help="Total optimizer steps for the LR schedule; default derived "
      "from --num-rollout * --num-steps-per-rollout.")
    a("--reset-optimizer-states", action="store_true", help="Clear optimizer state after each rollout (slime).")
    a("--critic-lr", type=float, default=None, help="Critic learning rate; default = --lr (slime).")
    a("--critic-lr-warmup-iters", type=int, default=0, help="Critic linear warmup steps (slime).")
    return parser


def add_checkpoint_group(parser):
    g = parser.add_argument_group("checkpoint", "Checkpoint loading and saving")
    a = g.add_argument
    a("--hf-checkpoint", default=None,
      help="HF checkpoint dir: tokenizer, config.json (checked against the model flags) and engine weights.")
    a("--ref-load", default=None, help="Reference model checkpoint; also the initial weights when --load is empty.")
    a("--ref-ckpt-step", type=int, default=None, help="Checkpoint step of --ref-load.")
    a("--load", default=None, help="Actor checkpoint to resume from; falls back to --ref-load.")
    a("--save", default=None, help="Directory for actor checkpoints.")
    a("--save-interval", type=int, default=None, help="Save every N rollouts (needs --save).")
    a("--no-save-optim", action="store_true", default=False, help="Do not save optimizer state.")
    a("--no-save-rng", action="store_true", default=None, help="Do not save RNG state.")
    a("--no-load-optim", action="store_true", default=None, help="Do not load optimizer state.")
    a("--no-load-rng", action="store_true", default=None, help="Do not load RNG state.")
    a("--finetune", action="store_true", help="Load weights only; reset iteration, optimizer and RNG.")
    a("--ckpt-format", default="torch_dist", choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"],
      help="Megatron checkpoint format.")
    a("--ckpt-step", type=int, default=None, help="Load this checkpoint step instead of the latest.")
    a("--async-save", action="store_true", help="Save checkpoints asynchronously.")
    a("--auto-detect-ckpt-format", action="store_true", help="Detect the checkpoint format when loading.")
    a("--save-hf", default=None, help="Also save HF-format weights to this path ('{rollout_id}' is substituted).")
    a("--critic-load", default=None, help="Critic checkpoint to load (slime); default = --load / --ref-load.")
    a("--critic-save", default=None, help="Directory for critic checkpoints (slime); default = <--save>_critic.")
    return parser

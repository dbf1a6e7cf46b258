"""Megatron's training machinery for one role: mixed-precision wrapper, DDP, optimizer, LR schedule.

Everything here is megatron-core's own (DistributedDataParallel, get_megatron_optimizer,
OptimizerParamScheduler); this module only maps our flags (Megatron-LM's names) onto their configs.

Two settings mcore needs that are easy to miss:
- `config.finalize_model_grads_func` and `config.no_sync_func` on the model's TransformerConfig: without
  them the pipeline schedule never all-reduces data-parallel gradients and every DP rank trains its own
  copy silently.
- `config.variable_seq_lengths` under pipeline parallelism: micro-batches here differ in length (padded
  to their own longest sample, or packed), so stages exchange tensor shapes before activations.
"""
from __future__ import annotations

import torch

from slime_like.backends.training.lr_schedule import schedule_kwargs
from slime_like.config.schedule import DECAY_STYLES, schedule_steps  # noqa: F401 (re-exported)


def wrap_for_training(args, chunks: list, trainable: bool = True) -> list:
    """Float16Module for bf16/fp16 models, then mcore DDP (grad buffers, DP reduce) when trainable."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.transformer.module import Float16Module

    config = chunks[0].config
    if args.bf16 or args.fp16:
        chunks = [Float16Module(config, c) for c in chunks]
    if not trainable:
        return chunks
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=bool(args.overlap_grad_reduce),
        use_distributed_optimizer=bool(args.use_distributed_optimizer),
        check_for_nan_in_grad=bool(args.check_for_nan_in_loss_and_grad))
    wrapped = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c,
                                       disable_bucketing=(i > 0)) for i, c in enumerate(chunks)]
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [w.no_sync for w in wrapped] if len(wrapped) > 1 else wrapped[0].no_sync
    config.calculate_per_token_loss = bool(args.calculate_per_token_loss)
    return wrapped


def optimizer_config_from_args(args):
    """OptimizerConfig from --optimizer/--lr/--min-lr/--weight-decay/--adam-*/--clip-grad/--bf16/...

    Only Adam (and SGD, which megatron also provides) are accepted; anything else fails here, by name.
    """
    from megatron.core.optimizer import OptimizerConfig

    name = args.optimizer
    if name not in ("adam", "sgd"):
        raise ValueError(f"--optimizer {name!r} is not supported by the Megatron trainer; use adam or sgd")
    if args.lr is None:
        raise ValueError("--lr is required for a trainable role (e.g. --lr 1e-6)")
    bf16, fp16 = bool(args.bf16), bool(args.fp16)
    return OptimizerConfig(
        optimizer=name, lr=float(args.lr), min_lr=float(args.min_lr),
        weight_decay=float(args.weight_decay),
        adam_beta1=float(args.adam_beta1), adam_beta2=float(args.adam_beta2),
        adam_eps=float(args.adam_eps), sgd_momentum=float(args.sgd_momentum),
        clip_grad=float(args.clip_grad), bf16=bf16, fp16=fp16,
        params_dtype=torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32,
        loss_scale=args.loss_scale,
        initial_loss_scale=float(args.initial_loss_scale),
        use_distributed_optimizer=bool(args.use_distributed_optimizer))


def build_optimizer(args, wrapped_chunks: list):
    from megatron.core.optimizer import get_megatron_optimizer

    optimizer = get_megatron_optimizer(optimizer_config_from_args(args), wrapped_chunks)
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        _prefer_fused_kernels(getattr(inner, "optimizer", None))
    return optimizer


def _prefer_fused_kernels(torch_optimizer) -> None:
    """Without TE / Apex, megatron-core falls back to torch's Adam / SGD, whose default is a per-parameter loop
    on CPU tensors (~10 ops each) and a multi-tensor (foreach) loop on CUDA. Adam gets torch's fused kernel
    instead (CPU and CUDA; the counterpart of TE's / Apex's FusedAdam on a GPU, which rounds like it rather than
    like the op-by-op loop): 113M params, 0.6 s (foreach) -> 0.13 s per step on one CPU thread, the same kernel
    transformers' Trainer picks by default (adamw_torch_fused). SGD takes the foreach path. TE's / Apex's own
    optimizers are left as they are."""
    if torch_optimizer is None:
        return
    on_fused_devices = all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                           for g in torch_optimizer.param_groups for p in g["params"])
    fused = type(torch_optimizer) in (torch.optim.Adam, torch.optim.AdamW) and on_fused_devices
    if not fused and type(torch_optimizer) is not torch.optim.SGD:
        return
    for group in torch_optimizer.param_groups:
        group["foreach"], group["fused"] = not fused, fused


def build_scheduler(args, optimizer):
    """megatron's OptimizerParamScheduler, stepped once per optimizer step (so `num_steps` = steps taken), over
    the flags' schedule (backends/training/lr_schedule.py: the same arguments our own LRSchedule takes)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(optimizer, **schedule_kwargs(args))


def current_lr(optimizer) -> float:
    groups = optimizer.param_groups
    return float(groups[0]["lr"]) if groups else 0.0


def reset_optimizer_states(optimizer) -> int:
    """--reset-optimizer-states: forget the optimizer's history before a rollout's steps.

    slime's help says the history is cleared; its code zeroes only the step counters, which leaves Adam's
    moments in place and restarts only the bias correction. Here the whole state goes (moments zeroed,
    step 0): the next step is exactly the first step of a fresh Adam at the same weights and LR schedule.
    Returns the number of parameter states reset (0 before the first step: nothing to forget).
    """
    count = 0
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_opt = getattr(inner, "optimizer", None)
        if torch_opt is None:
            continue
        for group in torch_opt.param_groups:
            if "step" in group:
                group["step"] = 0
        for state in torch_opt.state.values():
            for key, value in state.items():
                if torch.is_tensor(value):
                    value.zero_()
                elif key == "step":
                    state[key] = 0
            count += 1
    return count

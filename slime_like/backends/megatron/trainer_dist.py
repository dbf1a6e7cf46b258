"""The distributed bookkeeping of MegatronTrainer: the reference-model refresh, the non-finite checks, and
offload / onload of accelerator memory for colocated runs (results off the last pipeline stage and DP-averaged
metrics come from backends/training/collectives.py, shared with FSDP). Functions of the trainer's model chunks.

Kept apart from trainer.py so the training logic reads top to bottom without the bookkeeping.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def copy_weights(src_chunks: list, dst_chunks: list) -> None:
    """--ref-update-interval: the reference chunks become a copy of the current actor chunks."""
    with torch.no_grad():
        for actor, ref in zip(src_chunks, dst_chunks):
            ref_params = dict(ref.named_parameters())
            for name, p in actor.named_parameters():
                ref_params[name].copy_(p)


def grads_finite(model: list, ps, comm) -> bool:
    """True when every gradient of this model replica is finite (checked on every TP / PP rank).

    Read from the DDP grad buffers (`main_grad`) after the DP reduce, before the optimizer step clips and
    applies them: one NaN/inf would otherwise turn every weight NaN. One fused norm per dtype group."""
    grads = [getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None else p.grad
             for chunk in model for p in chunk.parameters()]
    grads = [g for g in grads if g is not None]
    bad = 0.0
    if grads:
        total = torch.stack([n.float() for n in torch._foreach_norm(grads)]).sum()
        bad = 0.0 if bool(torch.isfinite(total)) else 1.0
    flag = comm.all_reduce(torch.tensor([bad]), ps.get_model_parallel_group(), op=dist.ReduceOp.MAX)
    return flag.item() == 0.0


def weights_finite(model: list, comm) -> bool:
    """True when every parameter on every rank is finite (collective over the whole world)."""
    params = [p.detach() for chunk in model for p in chunk.parameters()]
    total = torch.stack([n.float() for n in torch._foreach_norm(params)]).sum() if params else torch.zeros(())
    bad = torch.tensor([0.0 if bool(torch.isfinite(total)) else 1.0])
    return comm.all_reduce(bad, None, op=dist.ReduceOp.MAX).item() == 0.0


def _buffers(model: list) -> list:
    return [b for m in model for b in list(getattr(m, "buffers", [])) +
            list(getattr(m, "expert_parallel_buffers", []))]


def release_memory(model: list, optimizer, frozen: list) -> None:
    """GPU memory to the host while rollout engines generate (colocated mode).

    DDP param/grad buffers are freed in place (`storage().resize_(0)` keeps every view valid and the params are
    copied to pinned CPU memory first), the optimizer moves its state to CPU, and params that live outside DDP
    buffers (non-distributed optimizer, the frozen reference / teacher chunks in `frozen`) are moved to CPU.
    """
    torch.cuda.synchronize()
    buffers = _buffers(model)
    params_in_buffers = any(b.param_data is not None for b in buffers)
    for b in buffers:
        b.offload_to_cpu(move_params=True, move_grads=True)
    if not params_in_buffers:
        for m in model:
            for p in m.parameters():
                p.data = p.data.to("cpu", non_blocking=True)
    if optimizer is not None:  # the reference worker has none
        optimizer.offload_to_cpu()
    for m in frozen:
        for p in m.parameters():
            p.data = p.data.to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def restore_memory(model: list, optimizer, frozen: list, device) -> None:
    """Inverse of release_memory(): weights, grads (zeroed) and optimizer state back on the accelerator."""
    buffers = _buffers(model)
    for b in buffers:
        b.reload_from_cpu(move_params=True, move_grads=True)
    if not any(b.param_data is not None for b in buffers):
        for m in model:
            for p in m.parameters():
                p.data = p.data.to(device, non_blocking=True)
    if optimizer is not None:
        optimizer.restore_from_cpu()
    for m in frozen:
        for p in m.parameters():
            p.data = p.data.to(device, non_blocking=True)
    torch.cuda.synchronize()

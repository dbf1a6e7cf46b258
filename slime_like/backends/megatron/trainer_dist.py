"""The distributed bookkeeping of MegatronTrainer: its place in the parallel layout, the reference-model refresh,
the non-finite checks, and offload / onload of accelerator memory for colocated runs (results off the last
pipeline stage and DP-averaged metrics come from backends/training/collectives.py, shared with FSDP).

Kept apart from trainer.py so the training logic reads top to bottom without the bookkeeping.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from slime_like.backends.training.collectives import CollectivesMixin


class TrainerDistMixin(CollectivesMixin):
    """Needs `self.ps` (megatron parallel_state), `self.model`, `self.optimizer`, `self.ref_model` (and
    `self.chunks` / `self.ref_chunks` for _update_reference)."""

    # ----------------------------------------------------------------- this rank's place, the reference copy
    def parallel_info(self) -> dict:
        """TrainerBackend.parallel_info: dp_rank, dp_size, tp_rank, pp_rank of this rank."""
        ps = self.ps
        return dict(dp_rank=ps.get_data_parallel_rank(), dp_size=ps.get_data_parallel_world_size(),
                    tp_rank=ps.get_tensor_model_parallel_rank(), pp_rank=ps.get_pipeline_model_parallel_rank())

    def _update_reference(self):
        """--ref-update-interval: the reference model becomes a copy of the current actor weights."""
        with torch.no_grad():
            for actor, ref in zip(self.chunks, self.ref_chunks):
                ref_params = dict(ref.named_parameters())
                for name, p in actor.named_parameters():
                    ref_params[name].copy_(p)

    # ----------------------------------------------------------------- non-finite checks
    def _grads_finite(self) -> bool:
        """True when every gradient of this model replica is finite (checked on every TP / PP rank).

        Read from the DDP grad buffers (`main_grad`) after the DP reduce, before the optimizer step clips and
        applies them: one NaN/inf would otherwise turn every weight NaN. One fused norm per dtype group."""
        grads = [getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None else p.grad
                 for chunk in self.model for p in chunk.parameters()]
        grads = [g for g in grads if g is not None]
        bad = 0.0
        if grads:
            total = torch.stack([n.float() for n in torch._foreach_norm(grads)]).sum()
            bad = 0.0 if bool(torch.isfinite(total)) else 1.0
        flag = self._all_reduce(torch.tensor([bad]), self.ps.get_model_parallel_group(), op=dist.ReduceOp.MAX)
        return flag.item() == 0.0

    def _weights_finite(self) -> bool:
        """True when every parameter on every rank is finite (collective over the whole world)."""
        params = [p.detach() for chunk in self.model for p in chunk.parameters()]
        total = torch.stack([n.float() for n in torch._foreach_norm(params)]).sum() if params else torch.zeros(())
        bad = torch.tensor([0.0 if bool(torch.isfinite(total)) else 1.0])
        return self._all_reduce(bad, None, op=dist.ReduceOp.MAX).item() == 0.0

    # ----------------------------------------------------------------- offload / onload
    def _buffers(self):
        return [b for m in self.model for b in list(getattr(m, "buffers", [])) +
                list(getattr(m, "expert_parallel_buffers", []))]

    def offload(self):
        """Release accelerator memory while rollout engines generate (colocated mode).

        GPU: DDP param/grad buffers are freed in place (`storage().resize_(0)` keeps every view valid and
        the params are copied to pinned CPU memory first), the optimizer moves its state to CPU, and
        params that live outside DDP buffers (non-distributed optimizer, the reference model) are moved
        to CPU. CPU: there is no accelerator memory to release, so this only records the state; the Ray
        layer calls the same method either way.
        """
        if self._offloaded:
            return
        self._offloaded = True
        if self.device is None:
            return
        torch.cuda.synchronize()
        buffers = self._buffers()
        params_in_buffers = any(b.param_data is not None for b in buffers)
        for b in buffers:
            b.offload_to_cpu(move_params=True, move_grads=True)
        if not params_in_buffers:
            for m in self.model:
                for p in m.parameters():
                    p.data = p.data.to("cpu", non_blocking=True)
        self.optimizer.offload_to_cpu()
        for m in (self.ref_model or []) + (self.teacher_model or []):
            for p in m.parameters():
                p.data = p.data.to("cpu", non_blocking=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def onload(self):
        """Inverse of offload(): weights, grads (zeroed) and optimizer state back on the accelerator."""
        if not self._offloaded:
            return
        self._offloaded = False
        if self.device is None:
            return
        buffers = self._buffers()
        for b in buffers:
            b.reload_from_cpu(move_params=True, move_grads=True)
        if not any(b.param_data is not None for b in buffers):
            for m in self.model:
                for p in m.parameters():
                    p.data = p.data.to(self.device, non_blocking=True)
        self.optimizer.restore_from_cpu()
        for m in (self.ref_model or []) + (self.teacher_model or []):
            for p in m.parameters():
                p.data = p.data.to(self.device, non_blocking=True)
        torch.cuda.synchronize()

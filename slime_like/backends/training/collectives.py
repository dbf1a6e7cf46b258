"""The collective plumbing every trainer backend shares: results off the last pipeline stage, small all-reduces,
DP-averaged step metrics and the rollout's average over optimizer steps.

One `Collectives(ps, device)` per trainer rank (RLTrainerBase.comm): `ps` is the parallel-state view (megatron's
parallel_state, or FSDP's pure data-parallel view), `device` the accelerator (None on CPU).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


class Collectives:
    def __init__(self, ps, device):
        self.ps, self.device = ps, device

    def from_last_stage(self, obj):
        """Broadcast a Python object from the last pipeline stage to every stage of this rank's PP group."""
        if self.ps.get_pipeline_model_parallel_world_size() == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.ps.get_pipeline_model_parallel_last_rank(),
                                   group=self.ps.get_pipeline_model_parallel_group())
        return box[0]

    def all_reduce(self, tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """all_reduce a small CPU tensor (NCCL needs it on the GPU; gloo takes it as is); returns a CPU tensor."""
        if not dist.is_initialized():
            return tensor
        if self.device is None:
            dist.all_reduce(tensor, op=op, group=group)
            return tensor
        on_device = tensor.to(self.device)
        dist.all_reduce(on_device, op=op, group=group)
        return on_device.cpu()

    def reduce_step_metrics(self, outs: list[dict], global_tokens: float) -> dict:
        """Sum the micro-batches' metric sums, all-reduce over DP, divide by the step's global token count.

        Keys ending in `_max` are maxima (all-reduced with MAX); `tokens` is reported as the global count.
        Under context parallelism each CP rank summed its part of every response: the group is DP x CP.
        Runs the DP all-reduce only on the last pipeline stage (whose DP group holds only last-stage ranks),
        then broadcasts the finished dict along the pipeline.
        """
        metrics = None
        if self.ps.is_pipeline_last_stage():
            keys = sorted({k for out in outs for k in out})
            sum_keys = [k for k in keys if not k.endswith("_max")]
            max_keys = [k for k in keys if k.endswith("_max")]
            group = self.ps.get_data_parallel_group(with_context_parallel=True)
            sums = torch.tensor([sum(float(out.get(k, 0.0)) for out in outs) for k in sum_keys], dtype=torch.float64)
            maxes = torch.tensor([max(float(out.get(k, -math.inf)) for out in outs) for k in max_keys],
                                 dtype=torch.float64)
            if self.ps.get_data_parallel_world_size(with_context_parallel=True) > 1:
                sums = self.all_reduce(sums, group)
                if max_keys:
                    maxes = self.all_reduce(maxes, group, op=dist.ReduceOp.MAX)
            metrics = {k: (v / global_tokens if k != "tokens" else v) for k, v in zip(sum_keys, sums.tolist())}
            metrics.update(zip(max_keys, maxes.tolist()))
        return self.from_last_stage(metrics)

    @staticmethod
    def average_steps(history: list[dict]) -> dict:
        """One dict for the rollout: mean over optimizer steps; lr = last step's; tokens summed."""
        out = {}
        for key in history[0]:
            values = [h[key] for h in history]
            if key == "lr":
                out[key] = values[-1]
            elif key in ("tokens", "nonfinite_steps"):
                out[key] = float(sum(values))
            elif key.endswith("_max"):
                out[key] = max(values)
            else:
                out[key] = sum(values) / len(values)
        out["num_steps"] = float(len(history))
        return out

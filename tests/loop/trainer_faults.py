"""Faults inside a trainer actor, for tests/loop/test_failure_console.py."""
import os
import signal

import torch.distributed as dist


def sigkill_rank_0_at_rollout_1(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """(--custom-megatron-before-train-step-hook-path) trainer rank 0 kills itself with SIGKILL before rollout 1's
    optimizer step, the other ranks go on into the step: what the kernel's OOM killer does to one rank."""
    if rollout_id == 1 and dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)

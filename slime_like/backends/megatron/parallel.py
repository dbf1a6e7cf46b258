"""torch.distributed + megatron-core model-parallel state for one trainer rank.

gloo on CPU (after `cpu_compat.apply()` and `cpu_kernels.apply()`), nccl on GPU. Megatron's rank order is
tp-cp-ep-dp-pp, so with world_size = tp * cp * dp * pp the data-parallel size is whatever is left after TP,
CP and PP.
"""
from __future__ import annotations

import os
import random
from datetime import timedelta

import torch
import torch.distributed as dist
from slime_like.utils import rendezvous
from slime_like.utils.net import free_port


def init_distributed(rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29500,
                     tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, etp: int | None = None,
                     seed: int = 1234, timeout_minutes: int = 30, vpp: int | None = None):
    """Initialise the process group (unless already done) and mcore's parallel state; seed every RNG.

    vpp: model chunks per pipeline rank (the interleaved schedule), None for one.
    Returns megatron.core.parallel_state. Seeds: python/torch get `seed`, and mcore's tracker gets its
    per-TP-rank model-parallel seed (seed + 2718 + tp_rank, mcore's rule) so dropout differs across TP ranks.
    """
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        raise ValueError(f"world size {world_size} is not divisible by tensor({tp}) x pipeline({pp}) x "
                         f"context({cp}) parallel sizes = {model_parallel}; change the trainer GPU count or the "
                         "--tensor/--pipeline/--context-model-parallel-size flags")
    if (world_size // (tp * pp)) % ep and ep > 1:
        raise ValueError(f"--expert-model-parallel-size {ep} must divide the data x context parallel size "
                         f"{world_size // (tp * pp)}")
    cuda = torch.cuda.is_available()
    if not cuda:
        from slime_like.backends.megatron import cpu_compat, cpu_kernels

        cpu_compat.apply()
        cpu_kernels.apply()  # exact, faster CPU versions of mcore's unfused hot spots
    if not dist.is_initialized():
        if cuda:
            local_rank = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
            torch.cuda.set_device(local_rank)
        rendezvous.init_process_group("nccl" if cuda else "gloo", rank, world_size, master_addr, master_port,
                                      timedelta(minutes=timeout_minutes))
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                     virtual_pipeline_model_parallel_size=vpp,
                                     context_parallel_size=cp, expert_model_parallel_size=ep,
                                     expert_tensor_parallel_size=etp,
                                     distributed_timeout_minutes=timeout_minutes)
    set_seed(seed)
    return ps


def set_seed(seed: int):
    """Seed python, torch and mcore's model-parallel RNG tracker (CUDA or, on CPU, the patched tracker)."""
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    # model_parallel_cuda_manual_seed on CPU (patched tracker) leaves the default CPU generator alone,
    # but re-seed anyway so the default stream is the same on every rank of a run.
    torch.manual_seed(seed)


def destroy_distributed():
    """Tear down mcore's parallel state and the process group (tests, tools)."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _rank_main(rank, fn, world_size, port, result_dir, args):
    import traceback

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        result = fn(rank, world_size, port, *args)
        torch.save({"ok": True, "result": result}, os.path.join(result_dir, f"rank{rank}.pt"))
    except BaseException:
        torch.save({"ok": False, "error": traceback.format_exc()}, os.path.join(result_dir, f"rank{rank}.pt"))
        raise


def run_local_ranks(fn, world_size: int, *args, timeout: float = 300.0, attempts: int = 3):
    """Run fn(rank, world_size, master_port, *args) in `world_size` spawned CPU processes; return results by rank.

    `fn` must be importable (module level). A failing rank raises here with its traceback. The free port
    can be taken by another process before rank 0 binds it (EADDRINUSE): then the run is retried. The ranks
    rendezvous on 127.0.0.1: the store and gloo listen on loopback only (utils/rendezvous.py).
    """
    for attempt in range(attempts):
        try:
            return _run_local_ranks(fn, world_size, args, timeout)
        except RuntimeError as e:
            taken = "EADDRINUSE" in str(e) or "Address already in use" in str(e)
            if not taken or attempt == attempts - 1:
                raise


def _run_local_ranks(fn, world_size, args, timeout):
    import multiprocessing as mp
    import tempfile
    import time

    port = free_port()
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as result_dir:
        procs = [ctx.Process(target=_rank_main, args=(r, fn, world_size, port, result_dir, args))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        # one deadline for all ranks; a rank that dies takes the others down (they would wait on it forever)
        deadline = time.monotonic() + timeout
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            time.sleep(0.1)
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        results = []
        for r, p in enumerate(procs):
            path = os.path.join(result_dir, f"rank{r}.pt")
            # weights_only=False is safe here: the file was written moments ago by our own child process into a
            # TemporaryDirectory of this call (mode 0700); it holds whatever fn returned, not tensors alone
            out = torch.load(path, weights_only=False) if os.path.exists(path) else None
            if out is None or not out["ok"]:
                failed = [f"rank {i}: {q.exitcode}" for i, q in enumerate(procs)]
                detail = out["error"] if out else f"no result (timeout {timeout}s or killed); exit codes {failed}"
                raise RuntimeError(f"rank {r} of {world_size} failed:\n{detail}")
            results.append(out["result"])
    return results

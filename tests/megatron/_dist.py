"""Multi-rank CPU test helper: run a module-level function in N spawned gloo processes.

    results = run_ranks(fn, 2, arg1, ...)   # fn(rank, world_size, port, arg1, ...) -> picklable result

Each child uses OMP_NUM_THREADS=1 and a fresh free port; a failing rank's traceback is raised here.
"""
import os
import sys

from slime_like.backends.megatron.parallel import free_port, run_local_ranks  # noqa: F401

os.environ.setdefault("OMP_NUM_THREADS", "1")
# spawned children import the test module by name: make this directory importable for them too
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run_ranks(fn, world_size, *args, timeout=240.0):
    return run_local_ranks(fn, world_size, *args, timeout=timeout)

"""A stand-alone process group between a trainer rank and rollout engines (the weight-sync group).

Built the way SGLang builds its ``/init_weights_update_group`` group, so the trainer side interoperates with
a real SGLang server: a ``tcp://`` rendezvous on (master_address, master_port) -- rank 0, the trainer, hosts
the TCPStore, listening on master_address only (utils/rendezvous.py) -- a ``PrefixStore(group_name, ...)`` so
several groups can share a port range, and
``_new_process_group_helper`` so the group works with ``torch.distributed.broadcast(..., group=pg)`` without
a default process group in the engine. Both sides call this same function.
"""
from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

from slime_like.utils import rendezvous


def init_custom_process_group(backend: str, init_method: str, world_size: int, rank: int, group_name: str,
                              timeout: timedelta = timedelta(seconds=300), rendezvous_timeout: timedelta | None = None):
    """Create a process group independent of the default one; blocks until all `world_size` ranks joined.

    `timeout` bounds the group's collectives; `rendezvous_timeout` (default: the same) how long joining its store
    may take (an engine gives up on an unreachable master sooner than on a slow broadcast).
    On a loopback rendezvous (a one-node run) every listener of the group, the store and gloo's, is loopback."""
    url = urlsplit(init_method)
    if url.scheme != "tcp" or not url.hostname or not url.port:
        raise ValueError(f"weight-sync rendezvous must be tcp://HOST:PORT, got {init_method!r}")
    store = PrefixStore(group_name, rendezvous.tcp_store(url.hostname, url.port, rank, world_size,
                                                         rendezvous_timeout or timeout))
    with rendezvous.gloo_interface_for(url.hostname):
        pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                          backend_options=None, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def destroy_process_group(pg) -> None:
    if pg is not None:
        dist.destroy_process_group(pg)


def torch_dtype(name: str) -> torch.dtype:
    """'bfloat16' / 'torch.bfloat16' -> torch.bfloat16 (SGLang sends the str() of the dtype, minus 'torch.')."""
    key = name.replace("torch.", "")
    dt = getattr(torch, key, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in /update_weights_from_distributed (expected e.g. 'bfloat16')")
    return dt

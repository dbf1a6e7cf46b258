"""torch.distributed rendezvous that listens on the address it is given, and nowhere else.

Two listeners of a process group are ours to place:
- The TCPStore on rank 0. torch's server socket (libuv and legacy backends alike) binds every interface (`::`)
  whatever host it is told (measured with torch 2.13), so rank 0 binds the socket itself, on `host` only, and
  hands it to the store (`master_listen_fd`).
- Gloo's device (each rank, each gloo group): it listens on the address the machine's hostname resolves to --
  on most hosts the routable one -- unless GLOO_SOCKET_IFNAME names an interface. For a loopback rendezvous
  (every rank on this host) it is pinned to the loopback interface.
NCCL's bootstrap sockets are NCCL's (NCCL_SOCKET_IFNAME); nothing here changes them.
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from datetime import timedelta

GLOO_IFNAME_VAR = "GLOO_SOCKET_IFNAME"
LOOPBACK_IFNAME = "lo"  # Linux's loopback interface (Ray, and so this project, runs on Linux)
_user_ifname: list = []  # the user's GLOO_SOCKET_IFNAME before pin_gloo_to_loopback replaced it (one entry)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta):
    """The group's store: rank 0 serves it on (host, port) only; the other ranks connect to it.

    A port taken since it was picked raises OSError (EADDRINUSE) on rank 0, as torch's own store does."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(host, port, world_size, False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.create_server((host.strip("[]"), port), family=family, backlog=max(128, world_size))
    try:
        store = dist.TCPStore(host, sock.getsockname()[1], world_size, True, timeout=timeout,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now and closes it itself
    return store


def pin_gloo_to_loopback() -> None:
    """Every gloo group this process creates from now on listens on loopback only (a one-node run's trainer).

    Process-wide on purpose: megatron-core and FSDP create gloo subgroups after init_process_group."""
    if not _user_ifname:
        _user_ifname.append(os.environ.get(GLOO_IFNAME_VAR))
    os.environ[GLOO_IFNAME_VAR] = LOOPBACK_IFNAME


@contextlib.contextmanager
def gloo_interface_for(host: str):
    """Gloo groups created in this block listen on loopback when `host` (the rendezvous) is a loopback address;
    else where the user's environment says (a loopback pin of this process is lifted for the block: the
    weight-sync group of a one-node trainer with an engine on another host must be reachable from there)."""
    saved = os.environ.get(GLOO_IFNAME_VAR)
    want = LOOPBACK_IFNAME if is_loopback(host) else (_user_ifname[0] if _user_ifname else saved)
    _set_env(GLOO_IFNAME_VAR, want)
    try:
        yield
    finally:
        _set_env(GLOO_IFNAME_VAR, saved)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def init_process_group(backend: str, rank: int, world_size: int, host: str, port: int, timeout: timedelta):
    """torch.distributed's default group, its store served on (host, port) only; gloo pinned to loopback when
    `host` is loopback (the caller puts every rank on this host only then)."""
    import torch.distributed as dist

    if is_loopback(host):
        pin_gloo_to_loopback()
    store = tcp_store(host, port, rank, world_size, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)

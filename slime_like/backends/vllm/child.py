"""vLLM's OpenAI server as the adapter's child: where it listens, its environment, its supervision, its exit.

vLLM answers its dev-mode routes (/collective_rpc runs named methods on the workers, /sleep, /pause, ...) without
the API key: its middleware guards only /v1, /v2, /inference and /cohere. So it must not listen where other
processes can reach it. It serves on a Unix socket (vLLM's ``--uds``) in a fresh directory of mode 0700 that only
this user can enter, created here and removed when the adapter exits; vLLM's engine-core and worker ZMQ sockets
(``ipc://``, under ``VLLM_RPC_BASE_PATH``) go there too. No port is picked, so no other process can take it
between the pick and vLLM's bind (the race of the former ``--port Q``).

What still listens on TCP is the worker's torch.distributed gloo groups (gloo has no Unix-socket transport; vLLM
rendezvouses them through a file store). Gloo listens where the hostname resolves unless GLOO_SOCKET_IFNAME says
otherwise, so an engine of a one-node run (adapter on loopback) pins them to loopback, as the trainer does.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile

from slime_like.utils import auth, rendezvous

SOCKET_NAME = "vllm.sock"
# A Unix socket path holds at most 107 bytes; vLLM names its ZMQ sockets <dir>/<uuid4> (dir + 37 bytes)
MAX_DIR_LEN = 107 - 37
# vLLM's address options: the adapter owns them (the argv after '--' carries none; the adapter adds --uds)
ADDRESS_FLAGS = ("--uds", "--host", "--port")


def private_socket_dir() -> str:
    """A fresh directory of mode 0700 (mkdtemp) short enough for Unix socket paths inside it."""
    base = tempfile.gettempdir()
    if len(os.path.join(base, "slime-vllm-XXXXXXXX")) > MAX_DIR_LEN:
        base = "/tmp"   # a long $TMPDIR would make vLLM's socket paths too long to bind
    return tempfile.mkdtemp(prefix="slime-vllm-", dir=base)


def refuse_address_flags(server_cmd: list[str]) -> None:
    given = [a for a in server_cmd if a.split("=", 1)[0] in ADDRESS_FLAGS]
    if given:
        raise SystemExit(f"vllm adapter: the vLLM argv after '--' has {given}; leave the address out, the adapter "
                         f"serves vLLM on a Unix socket of its own (--uds in a private directory)")


def child_env(device: str, api_key: str | None, socket_dir: str, host: str) -> dict:
    """vLLM's environment: dev-mode routes on, our worker extension importable, its ZMQ sockets in the private
    directory, its gloo groups on loopback when we serve on loopback, CPU defaults for a shared host, the run's
    secret as VLLM_API_KEY (vLLM's --api-key, kept out of argv)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_RPC_BASE_PATH=socket_dir)
    env.pop(auth.API_KEY_ENV, None)
    env.pop("VLLM_API_KEY", None)
    if api_key:
        env["VLLM_API_KEY"] = api_key
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    if rendezvous.is_loopback(host):
        env[rendezvous.GLOO_IFNAME_VAR] = rendezvous.LOOPBACK_IFNAME
    if device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")          # GiB of KV cache (vLLM's default 4 is for servers)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # do not pin threads to cores other processes use
    return env


class VLLMChild:
    """The vLLM server process, on ``<private dir>/vllm.sock``."""

    def __init__(self, server_cmd: list[str], device: str, api_key: str | None, host: str):
        refuse_address_flags(server_cmd)
        self.socket_dir = private_socket_dir()
        self.socket_path = os.path.join(self.socket_dir, SOCKET_NAME)
        try:
            self.popen = subprocess.Popen([*server_cmd, "--uds", self.socket_path],
                                          env=child_env(device, api_key, self.socket_dir, host))
        except BaseException:
            self.remove_dir()
            raise

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(grace)

    def remove_dir(self) -> None:
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def exit(self, code: int) -> None:
        """Stop vLLM, remove its directory, leave now (from a signal handler or the supervisor task)."""
        self.stop()
        self.remove_dir()
        os._exit(code)

    async def supervise(self, parent_pid: int | None) -> None:
        """Exit with vLLM's code when it dies; stop vLLM and exit when our launcher is gone."""
        while True:
            await asyncio.sleep(1.0)
            if self.popen.poll() is not None:
                print(f"vllm adapter: the vLLM server exited with code {self.popen.returncode}", flush=True)
                self.exit(self.popen.returncode or 1)
            if parent_pid and not _alive(parent_pid):
                print(f"vllm adapter: launcher pid {parent_pid} is gone; stopping vLLM", flush=True)
                self.exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True

"""Start rollout engine servers as child processes, whatever the engine (its `Engine.launch_command`).

    proc = start_engine(args, kind="sglang", engine_index=0, gpu_ids=[4, 5], host="10.0.0.1", port=30000)
    proc.url        # http://10.0.0.1:30000, healthy (/health_generate answered) when start_engine returns
    proc.stop()     # SIGTERM to the whole process group, SIGKILL after a grace period: no orphans

`kind` is a registered `--rollout-engine` value (`engine_api/engine.py`). A failed start raises
``EngineStartError`` naming the engine (index, URL) with the tail of its log.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from slime_like.backends.engine_api.engine import get_engine
from slime_like.utils.auth import API_KEY_ENV, auth_headers, resolve_api_key

# slime_like's own --sglang-* flags that configure the rollout client or router, not the server.
CLIENT_SIDE = frozenset({"server_concurrency", "router_ip", "router_port", "router_request_timeout_secs", "config",
                         "cli_options",
                         "server_args", "passthrough_mode", "router_policy"})


class EngineStartError(RuntimeError):
    pass


class EngineDied(RuntimeError):
    pass


def sglang_server_args(args) -> dict:
    """The user-set SGLang ServerArgs values the server takes (`args.sglang_server_args` less the client-side ones)."""
    return {k: v for k, v in args.sglang_server_args.items() if k not in CLIENT_SIDE and v is not None}


class EngineProcess:
    """A running engine server: its URL, process, and log file."""

    def __init__(self, name: str, url: str, popen: subprocess.Popen, log_path: str, api_key: str | None = None):
        self.name, self.url, self.popen, self.log_path = name, url, popen, log_path
        self.api_key = api_key

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def check_alive(self) -> None:
        """Raise EngineDied (naming the engine, its URL, exit code and log tail) if the process has exited."""
        if not self.alive():
            raise EngineDied(f"{self.name} at {self.url} died with exit code {self.popen.returncode}; log "
                             f"{self.log_path}, last lines:\n{self.log_tail()}")

    def wait_healthy(self, timeout: float) -> None:
        """Poll /health_generate until it answers 200; raise naming the engine with its log tail."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.alive():
                raise EngineStartError(f"{self.name} at {self.url} exited with code {self.popen.returncode} during "
                                       f"start-up; log {self.log_path}, last lines:\n{self.log_tail()}")
            try:
                req = urllib.request.Request(self.url + "/health_generate", headers=auth_headers(self.api_key))
                with urllib.request.urlopen(req, timeout=10) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise EngineStartError(f"{self.name} at {self.url} not healthy after {timeout:.0f}s; log {self.log_path}, "
                               f"last lines:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the engine's process group (it was started in its own session), SIGKILL after `grace`."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=grace)
        except ProcessLookupError:
            pass


    def kill(self) -> None:
        """SIGKILL the engine's process group at once: a hung (e.g. SIGSTOPped) engine never handles SIGTERM."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()


def start_engine(args, kind: str = "cpu", *, engine_index: int = 0, gpu_ids: list | None = None,
                 host: str = "127.0.0.1", port: int = 30000, log_dir: str | None = None,
                 health_timeout: float | None = None, env: dict | None = None,
                 cmd: list[str] | None = None, api_key: str | None = None, node=None,
                 pd: tuple | None = None) -> EngineProcess:
    """Start one engine server of the registered engine `kind` and wait until it generates.

    The server uses gpu_ids (the first is its base GPU). `cmd` overrides the command line (tests use it to start
    a process that fails). `api_key` (default: $SLIME_LIKE_ENGINE_API_KEY): the secret every route of the engine
    will require (`Engine.api_key_args`: SGLang's and vLLM's --api-key; the CPU engine reads it from its
    environment, not its argv, which any local user can read in ps). `pd`: (role, bootstrap port) of a prefill /
    decode disaggregated run (config/disaggregation.py), else None."""
    engine = get_engine(kind)
    api_key = resolve_api_key(api_key)
    name = f"rollout engine {engine_index} ({kind})"
    if node is not None:  # one node's process of an engine spanning nodes (engine_api/engine.EngineNode)
        name = f"rollout engine {engine_index} ({kind}, node {node.node_rank} of {node.nnodes})"
    if cmd is None and node is not None:
        cmd = engine.node_launch_command(args, host=host, port=port, gpu_ids=list(gpu_ids or [0]), node=node)
        cmd += engine.api_key_args(api_key) if api_key else []
    elif cmd is None:
        cmd = engine.launch_command(args, host=host, port=port, gpu_ids=list(gpu_ids or [0]))
        cmd += engine.api_key_args(api_key) if api_key else []
    if pd is not None:
        cmd += engine.disaggregation_args(*pd)
    log_dir = log_dir or os.path.join(args.save or tempfile.gettempdir(), "engine_logs")
    os.makedirs(log_dir, exist_ok=True)
    node_tag = f"_node{node.node_rank}" if node is not None else ""
    log_path = os.path.join(log_dir, f"engine_{engine_index}{node_tag}_{kind}_{port}.log")
    child_env = dict(os.environ, **(env or {}))
    child_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    child_env.pop(API_KEY_ENV, None)
    if api_key:
        child_env[API_KEY_ENV] = api_key
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join("<secret>" if c == api_key else c for c in cmd) + "\n").encode())
        log.flush()
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    proc = EngineProcess(name, f"http://{host}:{port}", popen, log_path, api_key)
    if health_timeout is None:
        health_timeout = engine.health_timeout_s
    try:
        proc.wait_healthy(health_timeout)
    except BaseException:
        proc.stop()
        raise
    return proc

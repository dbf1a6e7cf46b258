"""Start rollout engine servers as child processes: SGLang on GPUs, the embedded CPU engine otherwise.

    cmd = build_sglang_command(args, port=30000, host="10.0.0.1", base_gpu_id=4)
    proc = start_engine(args, kind="sglang", engine_index=0, gpu_ids=[4, 5], host="10.0.0.1", port=30000)
    proc.url        # http://10.0.0.1:30000, healthy (/health_generate answered) when start_engine returns
    proc.stop()     # SIGTERM to the whole process group, SIGKILL after a grace period: no orphans

One SGLang server per ``--rollout-num-gpus-per-engine`` GPUs (its ``--tp-size``), started from
``--hf-checkpoint`` with ``--base-gpu-id`` = the first GPU of its slot, plus every ``--sglang-*`` passthrough
value the user set (``args.sglang_server_args``; attributes ``args.sglang_<name>`` are accepted too when
that dict is absent). A failed start raises ``EngineStartError`` naming the engine (index, URL) with the tail
of its log.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# slime_like's own --sglang-* flags that configure the rollout client or router, not the server.
CLIENT_SIDE = frozenset({"server_concurrency", "router_ip", "router_port", "router_request_timeout_secs", "config",
                         "server_args", "passthrough_mode", "router_policy"})


class EngineStartError(RuntimeError):
    pass


class EngineDied(RuntimeError):
    pass


def sglang_server_args(args) -> dict:
    """The user-set SGLang ServerArgs values: `args.sglang_server_args`, else every `args.sglang_<name>`."""
    d = getattr(args, "sglang_server_args", None)
    if d is None:
        d = {k[len("sglang_"):]: v for k, v in vars(args).items() if k.startswith("sglang_")}
    return {k: v for k, v in d.items() if k not in CLIENT_SIDE and v is not None}


def _flag(name: str, value) -> list[str]:
    """One ServerArgs value as CLI tokens: True -> bare flag, False -> omitted, list -> repeated values."""
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return []
    if isinstance(value, (list, tuple)):
        return [flag, *map(str, value)]
    if isinstance(value, dict):
        import json
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def build_sglang_command(args, *, port: int, host: str = "127.0.0.1", base_gpu_id: int = 0,
                         tp_size: int | None = None, nccl_port: int | None = None, dist_init_addr: str | None = None,
                         nnodes: int = 1, node_rank: int = 0, python: str | None = None) -> list[str]:
    """argv for `python -m sglang.launch_server` serving args.hf_checkpoint on the given slot."""
    if not getattr(args, "hf_checkpoint", None):
        raise ValueError("--hf-checkpoint is required to start SGLang (it serves the HF weights and tokenizer)")
    tp = tp_size or getattr(args, "rollout_num_gpus_per_engine", 1)
    cmd = [python or sys.executable, "-m", "sglang.launch_server", "--model-path", args.hf_checkpoint,
           "--trust-remote-code", "--tp-size", str(tp), "--base-gpu-id", str(base_gpu_id),
           "--port", str(port), "--host", host]
    if getattr(args, "seed", None) is not None:
        cmd += ["--random-seed", str(args.seed)]
    if getattr(args, "offload_rollout", False) or getattr(args, "colocate", False):
        cmd += ["--enable-memory-saver"]  # /release_memory_occupation needs it
    if nccl_port is not None:
        cmd += ["--nccl-port", str(nccl_port)]
    if nnodes > 1 or dist_init_addr:
        if not dist_init_addr:
            raise ValueError(f"an engine spanning {nnodes} nodes needs dist_init_addr (host:port of its node 0)")
        cmd += ["--dist-init-addr", dist_init_addr, "--nnodes", str(nnodes), "--node-rank", str(node_rank)]
    for name, value in sorted(sglang_server_args(args).items()):
        cmd += _flag(name, value)
    return cmd


def build_cpu_engine_command(args, *, port: int, host: str = "127.0.0.1", python: str | None = None) -> list[str]:
    """argv for the embedded CPU engine (a subset of SGLang's flags that it understands)."""
    if not getattr(args, "hf_checkpoint", None):
        raise ValueError("--hf-checkpoint is required to start the CPU engine")
    sv = sglang_server_args(args)
    dtype = {"auto": "float32", "half": "float16"}.get(str(sv.get("dtype", "float32")), str(sv.get("dtype", "float32")))
    cmd = [python or sys.executable, "-m", "slime_like.backends.cpu_engine", "--model-path", args.hf_checkpoint,
           "--host", host, "--port", str(port), "--dtype", dtype, "--parent-pid", str(os.getpid())]
    for name in ("max_running_requests", "context_length"):
        if sv.get(name) is not None:
            cmd += ["--" + name.replace("_", "-"), str(sv[name])]
    if getattr(args, "seed", None) is not None:
        cmd += ["--random-seed", str(args.seed)]
    return cmd


class EngineProcess:
    """A running engine server: its URL, process, and log file."""

    def __init__(self, name: str, url: str, popen: subprocess.Popen, log_path: str):
        self.name, self.url, self.popen, self.log_path = name, url, popen, log_path

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
                with urllib.request.urlopen(self.url + "/health_generate", timeout=10) as r:
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


def start_engine(args, kind: str = "cpu", *, engine_index: int = 0, gpu_ids: list | None = None,
                 host: str = "127.0.0.1", port: int = 30000, log_dir: str | None = None,
                 health_timeout: float | None = None, env: dict | None = None, cmd: list[str] | None = None,
                 **sglang_kwargs) -> EngineProcess:
    """Start one engine server and wait until it generates; returns an EngineProcess.

    kind 'sglang' places the server on gpu_ids (base GPU id = gpu_ids[0]); 'cpu' runs the embedded engine.
    `cmd` overrides the command line (tests use it to start a process that fails)."""
    if kind not in ("cpu", "sglang"):
        raise ValueError(f"engine kind {kind!r}; choose 'cpu' or 'sglang'")
    name = f"rollout engine {engine_index} ({kind})"
    if cmd is None:
        if kind == "sglang":
            gpu_ids = list(gpu_ids or [0])
            cmd = build_sglang_command(args, port=port, host=host, base_gpu_id=int(gpu_ids[0]),
                                       tp_size=len(gpu_ids), **sglang_kwargs)
        else:
            cmd = build_cpu_engine_command(args, port=port, host=host)
    log_dir = log_dir or os.path.join(getattr(args, "save", None) or tempfile.gettempdir(), "engine_logs")
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"engine_{engine_index}_{kind}_{port}.log")
    child_env = dict(os.environ, **(env or {}))
    child_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    proc = EngineProcess(name, f"http://{host}:{port}", popen, log_path)
    if health_timeout is None:
        health_timeout = 900.0 if kind == "sglang" else 180.0
    try:
        proc.wait_healthy(health_timeout)
    except BaseException:
        proc.stop()
        raise
    return proc

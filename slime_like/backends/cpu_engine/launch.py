"""The embedded CPU engine as a rollout engine: the command that starts `python -m slime_like.backends.cpu_engine`."""
from __future__ import annotations

import os
import sys

from slime_like.backends.engine_api.engine import Engine
from slime_like.backends.engine_api.launcher import sglang_server_args


class CPUEngineServer(Engine):
    name = "cpu"
    health_timeout_s = 180.0

    def launch_command(self, args, *, host: str, port: int, gpu_ids: list[int]) -> list[str]:
        return build_cpu_engine_command(args, port=port, host=host)

    def node_launch_command(self, args, *, host: str, port: int, gpu_ids: list[int], node) -> list[str]:
        """Standing in for SGLang's multi-node engine where no GPU is (the two-node Ray tests): node 0 is the whole
        engine (one rank: it holds the model and receives every weight push), the other nodes serve /health_generate
        only, as SGLang's node ranks >= 1 do. Not a capability users get (the registry gives spans_nodes to SGLang
        only)."""
        return build_cpu_engine_command(args, port=port, host=host) + [
            "--nnodes", str(node.nnodes), "--node-rank", str(node.node_rank), "--dist-init-addr", node.dist_init_addr]

    def api_key_args(self, api_key: str) -> list[str]:
        return []  # the launcher hands the key over in SLIME_LIKE_ENGINE_API_KEY: argv is readable in ps


def build_cpu_engine_command(args, *, port: int, host: str = "127.0.0.1", python: str | None = None) -> list[str]:
    """argv for the embedded CPU engine (a subset of SGLang's flags that it understands)."""
    if not args.hf_checkpoint:
        raise ValueError("--hf-checkpoint is required to start the CPU engine")
    sv = sglang_server_args(args)
    dtype = {"auto": "float32", "half": "float16"}.get(str(sv.get("dtype", "float32")), str(sv.get("dtype", "float32")))
    cmd = [python or sys.executable, "-m", "slime_like.backends.cpu_engine", "--model-path", args.hf_checkpoint,
           "--host", host, "--port", str(port), "--dtype", dtype, "--parent-pid", str(os.getpid())]
    for name in ("max_running_requests", "context_length"):
        if sv.get(name) is not None:
            cmd += ["--" + name.replace("_", "-"), str(sv[name])]
    if args.seed is not None:
        cmd += ["--random-seed", str(args.seed)]
    sync_dirs = [d for d in (args.update_weight_disk_dir, args.update_weight_local_checkpoint_dir) if d]
    if sync_dirs:  # the run's disk weight sync writes there; the served model's parent stays allowed
        cmd += ["--weight-dirs", os.path.dirname(os.path.realpath(args.hf_checkpoint)), *sync_dirs]
    return cmd

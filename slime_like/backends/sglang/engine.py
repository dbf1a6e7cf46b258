"""SGLang as a rollout engine: `python -m sglang.launch_server` with the run's `--sglang-*` values.

    cmd = build_sglang_command(args, port=30000, host="10.0.0.1", base_gpu_id=4)

One SGLang server per ``--rollout-num-gpus-per-engine`` GPUs (its ``--tp-size``), started from
``--hf-checkpoint`` with ``--base-gpu-id`` = the first GPU of its slot, plus every ``--sglang-*`` passthrough
value the user set (``args.sglang_server_args``; attributes ``args.sglang_<name>`` are accepted too when
that dict is absent).
"""
from __future__ import annotations

import sys

from slime_like.backends.engine_api.engine import Engine
from slime_like.backends.engine_api.launcher import sglang_server_args


class SGLangEngine(Engine):
    name = "sglang"
    health_timeout_s = 900.0  # weights from disk, CUDA graphs: minutes for a large model

    def launch_command(self, args, *, host: str, port: int, gpu_ids: list[int]) -> list[str]:
        return build_sglang_command(args, port=port, host=host, base_gpu_id=int(gpu_ids[0]), tp_size=len(gpu_ids))

    def node_launch_command(self, args, *, host: str, port: int, gpu_ids: list[int], node) -> list[str]:
        """One node of a multi-node engine: TP over all its GPUs (nnodes x this node's), ranks meeting at node 0's
        --dist-init-addr. Node 0 serves the HTTP API; the others serve /health_generate only (SGLang's)."""
        return build_sglang_command(args, port=port, host=host, base_gpu_id=int(gpu_ids[0]),
                                    tp_size=len(gpu_ids) * node.nnodes, dist_init_addr=node.dist_init_addr,
                                    nnodes=node.nnodes, node_rank=node.node_rank)

    def weight_sync_ranks(self, args) -> int:
        return int(args.rollout_num_gpus_per_engine)  # SGLang joins every TP rank (rank_offset + tp_rank)

    def disaggregation_args(self, role: str, bootstrap_port: int | None) -> list[str]:
        """A prefill engine serves its KV cache to the decode engines from its bootstrap server (the port the
        router is told with --prefill URL PORT); on every node of an engine that spans nodes the same port."""
        if role not in ("prefill", "decode"):
            raise ValueError(f"disaggregation role {role!r}: prefill or decode")
        if role == "prefill" and bootstrap_port is None:
            raise ValueError("a prefill engine needs its bootstrap port")
        port = ["--disaggregation-bootstrap-port", str(bootstrap_port)] if role == "prefill" else []
        return ["--disaggregation-mode", role, *port]


def server_flag(name: str, value, option: str | None = None) -> list[str]:
    """One ServerArgs value as CLI tokens: True -> bare flag, False -> omitted, list -> repeated values.

    `option` is SGLang's own spelling when the flags were generated from ServerArgs (a field's option string
    can differ from its name: fp8_gemm_runner_backend is --fp8-gemm-backend)."""
    flag = option or "--" + name.replace("_", "-")
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
    if not args.hf_checkpoint:
        raise ValueError("--hf-checkpoint is required to start SGLang (it serves the HF weights and tokenizer)")
    tp = tp_size or args.rollout_num_gpus_per_engine
    cmd = [python or sys.executable, "-m", "sglang.launch_server", "--model-path", args.hf_checkpoint,
           "--tp-size", str(tp), "--base-gpu-id", str(base_gpu_id),
           "--port", str(port), "--host", host]
    if args.trust_remote_code:  # Megatron's --trust-remote-code: checkpoint code runs only on request
        cmd += ["--trust-remote-code"]
    if args.seed is not None:
        cmd += ["--random-seed", str(args.seed)]
    if args.offload_rollout or args.colocate:
        cmd += ["--enable-memory-saver"]  # /release_memory_occupation needs it
    if args.use_rollout_routing_replay:  # SGLang answers return_routed_experts only when started with it (as slime)
        cmd += ["--enable-return-routed-experts"]
    if nccl_port is not None:
        cmd += ["--nccl-port", str(nccl_port)]
    if nnodes > 1 or dist_init_addr:
        if not dist_init_addr:
            raise ValueError(f"an engine spanning {nnodes} nodes needs dist_init_addr (host:port of its node 0)")
        cmd += ["--dist-init-addr", dist_init_addr, "--nnodes", str(nnodes), "--node-rank", str(node_rank)]
    options = args.sglang_cli_options
    for name, value in sorted(sglang_server_args(args).items()):
        cmd += server_flag(name, value, options.get(name))
    return cmd

"""python -m slime_like.backends.cpu_engine --model-path HF_DIR --host 127.0.0.1 --port P [options]

Starts the embedded CPU engine: SGLang's native HTTP API served by a transformers model with continuous batching.
"""
from __future__ import annotations

import argparse
import logging
import os


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m slime_like.backends.cpu_engine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True, help="Hugging Face model dir (config.json + *.safetensors + tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    # Rows decoded together at most. Large by default: on CPU a decode step costs mostly fixed Python overhead,
    # so one step over 512 rows is far cheaper than 8 over 64 (a row only adds its KV cache to memory).
    p.add_argument("--max-running-requests", type=int, default=512, help="rows decoded together at most")
    p.add_argument("--context-length", type=int, default=None, help="default: the model's max_position_embeddings")
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--api-key", default=None,
                   help="SGLang's flag: every route requires 'Authorization: Bearer KEY'. Prefer the environment "
                        "variable SLIME_LIKE_ENGINE_API_KEY (a flag value shows in ps); the flag wins when both are set")
    p.add_argument("--max-request-bytes", type=int, default=64 << 20, help="largest request body accepted (413 above)")
    p.add_argument("--max-text-chars", type=int, default=1 << 22,
                   help="most characters of prompt `text` per /generate request (400 above); send input_ids for more")
    p.add_argument("--weight-dirs", nargs="+", default=None,
                   help="directories /update_weights_from_disk may load from (default: --model-path's parent)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes of the engine (a stand-in for SGLang's: see --node-rank)")
    p.add_argument("--node-rank", type=int, default=0,
                   help="this process's node of the engine; above 0 it serves /health and /health_generate only, as "
                        "SGLang's non-zero node ranks do (node 0 holds the model: the CPU engine is one rank)")
    p.add_argument("--dist-init-addr", default=None, help="node 0's host:port (SGLang's; recorded, not dialled)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process (the launcher) is gone, so a killed launcher leaves no engine behind")
    return p


def watch_parent(parent_pid: int, interval: float = 1.0) -> None:
    """SIGTERM ourselves once `parent_pid` stops being our parent (it died and we were re-parented)."""
    import signal
    import threading
    import time

    def loop():
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=loop, name="parent-watch", daemon=True).start()


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_key(host: str, api_key: str | None) -> None:
    """No key: refused off loopback (every route, weight loading included, would be open to the network); a
    warning on loopback (open to every local user)."""
    if api_key:
        return
    if not _is_loopback(host):
        raise SystemExit(f"--host {host}: an engine listening off loopback needs an API key (set "
                         "SLIME_LIKE_ENGINE_API_KEY, or --api-key); without one every route is open to the network")
    logging.getLogger("slime_like.cpu_engine").warning(
        "no API key (SLIME_LIKE_ENGINE_API_KEY / --api-key): every route on %s answers any local process", host)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if not os.path.isfile(os.path.join(args.model_path, "config.json")):  # fail before the slow torch import
        raise SystemExit(f"--model-path {args.model_path!r} has no config.json (expected a Hugging Face model dir)")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from slime_like.utils.auth import resolve_api_key

    api_key = resolve_api_key(args.api_key)
    check_key(args.host, api_key)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.parent_pid:
        watch_parent(args.parent_pid)
    if args.node_rank > 0:
        return serve_node_health(args)
    import torch
    from aiohttp import web

    from slime_like.backends.cpu_engine.engine import CPUEngine
    from slime_like.backends.cpu_engine.server import build_app

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    engine = CPUEngine(args.model_path, dtype=args.dtype, max_running_requests=args.max_running_requests,
                       random_seed=args.random_seed, context_length=args.context_length, weight_dirs=args.weight_dirs)
    logging.getLogger("slime_like.cpu_engine").info("CPU engine ready: %s on http://%s:%d", args.model_path,
                                                     args.host, args.port)
    app = build_app(engine, api_key, max_request_bytes=args.max_request_bytes,
                    max_text_chars=args.max_text_chars)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its requests
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=2.0,
                handler_cancellation=True)


def serve_node_health(args) -> None:
    """Node rank >= 1 of an engine spanning nodes: /health and /health_generate answer 200, nothing else is served
    (SGLang's launch_dummy_health_check_server for its non-zero node ranks)."""
    from aiohttp import web

    async def healthy(request):
        return web.Response(status=200)

    app = web.Application()
    for route in ("/health", "/health_generate"):
        app.router.add_get(route, healthy)
    logging.getLogger("slime_like.cpu_engine").info("node %d of %d (node 0 at %s): health routes on http://%s:%d",
                                                     args.node_rank, args.nnodes, args.dist_init_addr, args.host,
                                                     args.port)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=2.0)


if __name__ == "__main__":
    main()

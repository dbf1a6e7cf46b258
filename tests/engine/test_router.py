"""The sglang-router in front of several engines: --router-* passthrough, the exact command, and how a run
gets its router (started, an existing one through --sglang-router-ip/port, or none)."""
import threading

import pytest
from aiohttp import web

from engine_helpers import free_port
from slime_like.args import parse_args, parse_run
from slime_like.backends.engine_api.launcher import EngineStartError
from slime_like.backends.sglang.router import add_worker_url, build_router_command, remove_worker
from slime_like.config.errors import ConfigError
from slime_like.ray.rollout_manager import start_router_for

URLS = ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]


def _args(tiny_ckpt, *flags):
    return parse_args(["--hf-checkpoint", tiny_ckpt, "--rollout-batch-size", "2", "--num-rollout", "1",
                       "--rollout-engine", "cpu", "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "2",
                       *flags], exit_on_error=False)


def test_router_passthrough_reaches_the_command(tiny_ckpt):
    argv = ["--hf-checkpoint", tiny_ckpt, "--rollout-batch-size", "2", "--num-rollout", "1", "--rollout-engine", "cpu",
            "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "2", "--router-policy", "round_robin",
            "--router-balance-abs-threshold", "4", "--router-log-level", "warn",
            "--sglang-router-request-timeout-secs", "60"]
    args, _, report = parse_run(argv, exit_on_error=False)
    assert args.router_args == {"policy": "round_robin", "balance_abs_threshold": 4, "log_level": "warn"}
    # the cpu engines need no router: the values are accepted, and the run says they do nothing here
    assert any("--router-policy round_robin" in w and "no effect" in w for w in report.warnings)
    cmd = build_router_command(args, URLS, host="10.0.0.9", port=3000, python="python")
    assert cmd == ["python", "-m", "sglang_router.launch_router", "--host", "10.0.0.9", "--port", "3000",
                   "--policy", "round_robin", "--worker-urls", *URLS, "--request-timeout-secs", "60",
                   "--balance-abs-threshold", "4", "--log-level", "warn"]
    assert add_worker_url("http://r:3000/", "http://10.0.0.3:30000") == \
        "http://r:3000/add_worker?url=http%3A%2F%2F10.0.0.3%3A30000"
    args.engine_api_key = "run-secret"  # what Run.start resolves: the engines require it, so the router sends it
    assert build_router_command(args, URLS, python="python")[-6:] == [
        "--api-key", "run-secret", "--balance-abs-threshold", "4", "--log-level", "warn"]
    args.router_args = {"policy": "round_robn"}
    with pytest.raises(ValueError, match="did you mean 'round_robin'"):
        build_router_command(args, [])


def test_router_flags_are_checked(tiny_ckpt):
    with pytest.raises(ConfigError, match="--router-port is set by the driver"):
        _args(tiny_ckpt, "--router-port", "1")
    with pytest.raises(ConfigError, match="give both"):
        _args(tiny_ckpt, "--sglang-router-ip", "127.0.0.1")


def test_a_run_gets_its_router(tiny_ckpt):
    """SGLang engines: the driver starts sglang_router (refused clearly where it is not installed); CPU engines:
    none; --sglang-router-ip/port: every engine registers with that router (with the run's key), which then takes
    the /generate; a dead engine is removed from it."""
    args = _args(tiny_ckpt)
    assert start_router_for(args, "cpu", URLS) == (None, None)
    assert start_router_for(args, "sglang", URLS[:1]) == (None, None)  # one engine: nothing to route
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        with pytest.raises(EngineStartError, match="sglang-router is not installed"):
            start_router_for(args, "sglang", URLS)

    # a router older than sglang-router 0.3 (no /workers): the legacy routes, each request recorded
    # (sglang-router 0.3's /workers API is exercised by the real router in tests/loop/test_fault_tolerance_router.py)
    seen, listed = [], []

    async def on_add(request):
        seen.append((request.method, request.path, request.query["url"], request.headers.get("Authorization")))
        listed.append(request.query["url"])
        return web.json_response({"status": "ok"})

    async def on_remove(request):
        seen.append((request.method, request.path, request.query["url"], request.headers.get("Authorization")))
        listed.remove(request.query["url"])
        return web.json_response({"status": "ok"})

    async def on_list(request):
        return web.json_response({"urls": listed})

    app = web.Application()
    app.router.add_post("/add_worker", on_add)
    app.router.add_post("/remove_worker", on_remove)
    app.router.add_get("/list_workers", on_list)
    runner = web.AppRunner(app)
    port = free_port()
    import asyncio

    loop = asyncio.new_event_loop()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        args = _args(tiny_ckpt, "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(port))
        args.engine_api_key = "run-secret"   # the router's own routes require it too
        assert start_router_for(args, "cpu", URLS) == (None, f"http://127.0.0.1:{port}")
        assert seen == [("POST", "/add_worker", u, "Bearer run-secret") for u in URLS]
        assert remove_worker(f"http://127.0.0.1:{port}", URLS[0], "run-secret") is True
        assert remove_worker(f"http://127.0.0.1:{port}", URLS[0], "run-secret") is False   # not listed: no request
        assert seen[2:] == [("POST", "/remove_worker", URLS[0], "Bearer run-secret")] and listed == URLS[1:]
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

"""sglang-router (SGLang Model Gateway) in front of several engines: command line, start, worker registration.

    python -m sglang_router.launch_router --worker-urls URL1 URL2 --host H --port P --policy cache_aware \
        --request-timeout-secs N

The router speaks the same native API as one engine (/generate, /health, ...), so the rollout client only
changes its base URL. Engines started later join through ``POST /add_worker?url=...``. The Ray layer starts
one for a run with several SGLang engines (`ray/rollout_manager.py:start_router_for`), as slime does, or
uses the one `--sglang-router-ip/--sglang-router-port` name. The CPU engine needs none (and there is no
router package on CPU): the rollout client spreads requests over the engine URLs itself.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import urllib.parse

from slime_like.backends.engine_api.launcher import EngineProcess, EngineStartError
from slime_like.backends.sglang.engine import server_flag

# sglang-router 0.3.2's --policy choices (checked by its own parser in tests/sglang_peer). "bucket",
# "consistent_hashing" and "prefix_hash" belong to its successor, the smg gateway (`python -m smg.launch_router`),
# not to sglang_router.launch_router, which this command runs.
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")


def build_router_command(args, worker_urls: list[str], *, host: str = "127.0.0.1", port: int = 30000,
                         python: str | None = None) -> list[str]:
    """argv for `python -m sglang_router.launch_router` routing over `worker_urls`.

    `--router-NAME VALUE` passthrough values (args.router_args) follow as `--NAME VALUE` (policy: cache_aware
    unless `--router-policy` says otherwise); `--sglang-router-request-timeout-secs` is slime's name for the
    router's `--request-timeout-secs`. With a run secret (`args.engine_api_key`) the router gets it as
    `--api-key`, the key it sends to the workers: the engines require it on every route."""
    extra = dict(args.router_args)
    policy = str(extra.pop("policy", "cache_aware"))
    if policy not in POLICIES:
        import difflib
        close = difflib.get_close_matches(policy, POLICIES, n=1)
        raise ValueError(f"--router-policy {policy!r} is unknown" + (f"; did you mean {close[0]!r}?" if close else
                                                                     f"; choose one of {POLICIES}"))
    cmd = [python or sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
           "--policy", policy]
    if worker_urls:
        cmd += ["--worker-urls", *worker_urls]
    if "request_timeout_secs" not in extra and args.sglang_router_request_timeout_secs is not None:
        cmd += ["--request-timeout-secs", str(args.sglang_router_request_timeout_secs)]
    if args.engine_api_key and "api_key" not in extra:  # same exposure as the engines' own --api-key argv
        cmd += ["--api-key", args.engine_api_key]
    for name, value in sorted(extra.items()):
        cmd += server_flag(name, value)
    return cmd


def add_worker_url(router_url: str, worker_url: str) -> str:
    """The registration request a late engine sends: POST {router}/add_worker?url={worker}."""
    return f"{router_url.rstrip('/')}/add_worker?{urllib.parse.urlencode({'url': worker_url})}"


def add_worker(router_url: str, worker_url: str, timeout: float = 60.0) -> None:
    import urllib.request

    req = urllib.request.Request(add_worker_url(router_url, worker_url), data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()


def start_router(args, worker_urls: list[str], *, host: str = "127.0.0.1", port: int = 30000,
                 log_dir: str | None = None, health_timeout: float = 120.0,
                 cmd: list[str] | None = None) -> EngineProcess:
    """Start the router as a child process and wait for its /health; raises EngineStartError with its log."""
    if cmd is None and importlib.util.find_spec("sglang_router") is None:
        raise EngineStartError("sglang-router is not installed (pip install sglang-router); on CPU, point the "
                               "rollout at the engine URLs directly instead of a router")
    cmd = cmd or build_router_command(args, worker_urls, host=host, port=port)
    log_dir = log_dir or os.path.join(args.save or tempfile.gettempdir(), "engine_logs")
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"router_{port}.log")
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc = EngineProcess("sglang-router", f"http://{host}:{port}", popen, log_path)
    _wait_health(proc, health_timeout)
    return proc


def _wait_health(proc: EngineProcess, timeout: float) -> None:
    import time
    import urllib.error
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if not proc.alive():
            raise EngineStartError(f"{proc.name} at {proc.url} exited with code {proc.popen.returncode}; "
                                   f"last lines of {proc.log_path}:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(proc.url + "/health", timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    proc.stop()
    raise EngineStartError(f"{proc.name} at {proc.url} not healthy after {timeout:.0f}s; last lines of "
                           f"{proc.log_path}:\n{proc.log_tail()}")

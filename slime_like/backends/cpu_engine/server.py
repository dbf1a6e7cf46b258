"""aiohttp app exposing the CPU engine through SGLang's native HTTP API (thin: parse, call engine, shape JSON).

Blocking work (weight loading, receiving broadcasts from the trainer, waiting for a group rendezvous) runs in
worker threads via ``run_in_executor`` so the event loop keeps answering /health, /abort_request, /generate.
Errors are JSON ``{"error": {"message": ...}}`` with status 400, like SGLang's.
"""
from __future__ import annotations

import asyncio
import binascii
import logging
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
from aiohttp import web

from slime_like.backends.cpu_engine import weights
from slime_like.backends.cpu_engine.engine import CPUEngine, Request
from slime_like.backends.cpu_engine.sampling import SamplingParams
from slime_like.backends.engine_api import process_group, protocol, tensor_serializer
from slime_like.backends.engine_api.protocol import BadRequest
from slime_like.utils import auth

logger = logging.getLogger("slime_like.cpu_engine")
# Largest request body (--max-request-bytes): a 512-prompt batch of 4k-token ids is ~12 MB of JSON; weight
# routes carry names and shared-memory handles, not tensors.
MAX_REQUEST_BYTES = 64 << 20
routes = web.RouteTableDef()


def _err(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}, "success": False, "message": message}, status=status)


@web.middleware
async def require_api_key(request, handler):
    """With a key configured, every route but GET /health needs `Authorization: Bearer <key>` (401 otherwise).
    /health is open as in SGLang (which opens /health*, /ready, /metrics): sglang-router checks a worker's
    /health without a key before it registers it, and the answer is an empty 200 (not /health_generate, which
    runs the model)."""
    key = request.app["api_key"]
    open_health = request.path == "/health" and request.method in ("GET", "HEAD")
    if key and not open_health and not auth.authorized(request.headers.get("Authorization"), key):
        return _err(f"{request.path}: missing or wrong 'Authorization: Bearer <key>' (this engine was started with "
                    f"an API key)", status=401)
    return await handler(request)


@web.middleware
async def errors_as_json(request, handler):
    try:
        return await handler(request)
    except BadRequest as e:
        return _err(str(e))
    except web.HTTPException:
        raise
    except Exception as e:  # report, don't hang the client
        logger.exception("%s failed", request.path)
        return _err(f"{type(e).__name__}: {e}", status=500)


# A weight-sync rendezvous the trainer starts before calling: its store answers at once, the other engines join
# within seconds. Past this a master is unreachable (the route answers 504).
RENDEZVOUS_TIMEOUT = timedelta(seconds=60)


async def _json(request) -> dict:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError as e:
        raise BadRequest(f"{request.path}: body is not valid JSON ({e})")
    except RecursionError:
        raise BadRequest(f"{request.path}: body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest(f"{request.path}: body must be a JSON object")
    return body


def _fields(body: dict, path: str, allowed: set[str], required: set[str] = frozenset()) -> dict:
    unknown, missing = set(body) - allowed, set(required) - set(body)
    if unknown or missing:
        raise BadRequest(f"{path}: unknown field(s) {sorted(unknown)} / missing {sorted(missing)}; "
                         f"allowed: {sorted(allowed)}")
    return body


def _typed(body: dict, path: str, types: dict) -> dict:
    """400, not a 500 from deep inside, for a field of the wrong JSON type: {field: (type, ...)}; bool is not an int."""
    for name, allowed in types.items():
        if name in body and (not isinstance(body[name], allowed)
                             or isinstance(body[name], bool) and bool not in allowed):
            raise BadRequest(f"{path}: {name} must be {' or '.join(t.__name__ for t in allowed)}, got "
                             f"{type(body[name]).__name__} {str(body[name])[:40]!r}")
    return body


def _int_list(value, path: str, name: str) -> list:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                              for v in value):
        raise BadRequest(f"{path}: {name} must be a list of non-negative integers, got {str(value)[:60]!r}")
    return value


async def _in_thread(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _engine(request) -> CPUEngine:
    return request.app["engine"]


# ---------------------------------------------------------------------------------------------- generation
@routes.post("/generate")
async def generate(request):
    eng = _engine(request)
    # Parsing tokenizes `text`: in the one tokenizer thread, so a large prompt never stalls the event loop
    # (health checks, aborts and other requests keep being answered) and the tokenizer is never shared.
    body = await _json(request)
    parsed, is_batch = await asyncio.get_running_loop().run_in_executor(
        request.app["tokenizer_thread"], protocol.parse_generate, body, eng.tokenizer, request.app["max_text_chars"])
    reqs = _to_engine_requests(parsed)
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


@routes.post("/abort_request")
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


@routes.post("/pause_generation")
async def pause_generation(request):
    mode = (await _json(request)).get("mode", "abort")
    if not isinstance(mode, str) or mode not in ("abort", "retract", "in_place"):
        raise BadRequest(f"/pause_generation mode {mode!r}; expected 'abort', 'retract' or 'in_place'")
    _engine(request).pause(abort_running=(mode == "abort"))
    return web.json_response({"success": True, "mode": mode})


@routes.post("/continue_generation")
async def continue_generation(request):
    _engine(request).resume()
    return web.json_response({"success": True})


# ---------------------------------------------------------------------------------------------- status
@routes.get("/health")
async def health(request):
    return web.Response(status=200)


@routes.get("/health_generate")
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


@routes.get("/get_model_info")
async def get_model_info(request):
    eng = _engine(request)
    return web.json_response({"model_path": eng.model_path, "tokenizer_path": eng.model_path, "is_generation": True,
                              "preferred_sampling_params": None, "weight_version": eng.weight_version,
                              "model_type": eng.model.config.model_type,
                              "architectures": getattr(eng.model.config, "architectures", None)})


@routes.get("/get_server_info")
async def get_server_info(request):
    eng = _engine(request)
    stats = dict(eng.stats)
    stats["mean_decode_batch_size"] = stats["decode_rows"] / max(1, stats["decode_steps"])
    return web.json_response({"model_path": eng.model_path, "engine": "slime_like.cpu_engine",
                              "dtype": str(eng.dtype).replace("torch.", ""),
                              "max_running_requests": eng.max_running_requests, "context_length": eng.context_length,
                              "weight_version": eng.weight_version, "memory_released": eng.released,
                              "internal_states": [stats]})


@routes.route("*", "/flush_cache")
async def flush_cache(request):
    # No prefix cache to drop: KV rows live only as long as their request. Answer like SGLang does.
    return web.Response(status=200, text="Cache flushed.")


# ---------------------------------------------------------------------------------------------- weights
@routes.post("/update_weights_from_disk")
async def update_weights_from_disk(request):
    body = _fields(await _json(request), "/update_weights_from_disk",
                   {"model_path", "load_format", "abort_all_requests", "weight_version", "is_async", "token_step",
                    "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "flush_cache", "manifest"}, {"model_path"})
    eng = _engine(request)
    if body.get("abort_all_requests"):
        eng.abort(abort_all=True)
    n = await _in_thread(eng.update_weights_from_disk, body["model_path"], body.get("weight_version"))
    return web.json_response({"success": True, "message": f"Succeeded to update model weights ({n} tensors).",
                              "num_paused_requests": 0})


@routes.post("/update_weights_from_tensor")
async def update_weights_from_tensor(request):
    body = _fields(await _json(request), "/update_weights_from_tensor",
                   {"serialized_named_tensors", "load_format", "flush_cache", "abort_all_requests", "weight_version",
                    "disable_draft_model", "torch_empty_cache"}, {"serialized_named_tensors"})
    if not request.app["api_key"]:  # the payload names shared-memory segments: only from a caller we know
        return _err("/update_weights_from_tensor needs an engine started with an API key (SLIME_LIKE_ENGINE_API_KEY "
                    "or --api-key): it maps shared memory named by the caller", status=403)
    eng = _engine(request)
    blobs = body["serialized_named_tensors"]
    if not isinstance(blobs, list) or len(blobs) != 1:
        raise BadRequest(f"serialized_named_tensors must hold one entry per TP rank; the CPU engine has tp_size=1, "
                         f"got {len(blobs) if isinstance(blobs, list) else type(blobs).__name__}")
    fmt = body.get("load_format")
    if fmt not in (None, "direct", "flattened_bucket"):
        raise BadRequest(f"load_format {fmt!r} is not supported; use null, 'direct' or 'flattened_bucket'")
    if body.get("abort_all_requests"):
        eng.abort(abort_all=True)

    def load():
        try:
            payload = tensor_serializer.deserialize(blobs[0], eng.max_payload_bytes)
        except (pickle.UnpicklingError, binascii.Error, EOFError) as e:
            raise BadRequest(f"/update_weights_from_tensor: {e}") from None
        named = _unflatten(payload) if fmt == "flattened_bucket" else payload
        return eng.update_weights(named, body.get("weight_version"))

    n = await _in_thread(load)
    return web.json_response({"success": True, "message": f"Succeeded to update model weights ({n} tensors)."})


def _unflatten(payload: dict):
    """SGLang's flattened bucket: one flat tensor + per-tensor metadata (name, shape, dtype, start_idx, end_idx)."""
    flat = payload["flattened_tensor"]
    for m in payload["metadata"]:
        get = (lambda k: m[k]) if isinstance(m, dict) else (lambda k: getattr(m, k))
        yield get("name"), flat[get("start_idx"):get("end_idx")].view(get("dtype")).reshape(get("shape"))


@routes.post("/init_weights_update_group")
async def init_weights_update_group(request):
    body = _typed(_fields(await _json(request), "/init_weights_update_group",
                          {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"},
                          {"master_address", "master_port", "rank_offset", "world_size"}),
                  "/init_weights_update_group", {"master_address": (str,), "master_port": (int,),
                                                 "rank_offset": (int,), "world_size": (int,), "group_name": (str,),
                                                 "backend": (str,)})
    if not 0 < body["master_port"] < 65536 or not 0 < body["rank_offset"] < body["world_size"]:
        raise BadRequest(f"/init_weights_update_group: master_port {body['master_port']} must be 1-65535 and "
                         f"rank_offset {body['rank_offset']} in 1..world_size-1 ({body['world_size']}; rank 0 is "
                         "the trainer)")
    backend = body.get("backend", "nccl")
    if backend != "gloo":
        raise BadRequest(f"backend {backend!r} needs CUDA; the CPU engine joins weight-sync groups with 'gloo' "
                         "(use DistributedWeightSender(backend='gloo'))")
    name = body.get("group_name", "weight_update_group")
    groups = request.app["weight_groups"]
    if name in groups:
        raise BadRequest(f"weight update group {name!r} already exists; /destroy_weights_update_group it first")
    rank = int(body["rank_offset"])  # tp_rank 0 + offset: this engine is a single rank
    init = f"tcp://{body['master_address']}:{body['master_port']}"
    # One rendezvous at a time, on a thread of its own: a master that never answers holds that thread until the
    # timeout, not the workers that serve /generate and /health (six such calls once held them all for 3.5 min).
    if request.app["rendezvous_busy"]:
        return _err("/init_weights_update_group: another weight-update group is being joined; retry when it "
                    "finished", status=409)
    request.app["rendezvous_busy"] = True
    t0 = time.time()
    try:
        groups[name] = await asyncio.get_running_loop().run_in_executor(
            request.app["rendezvous_thread"], lambda: process_group.init_custom_process_group(
                "gloo", init, int(body["world_size"]), rank, name, timeout=timedelta(seconds=120),
                rendezvous_timeout=RENDEZVOUS_TIMEOUT))
    except (RuntimeError, ValueError, OSError) as e:  # torch's DistStoreError / timeouts are RuntimeErrors
        return _err(f"/init_weights_update_group: joining {init} as rank {rank} of {body['world_size']} failed "
                    f"within {RENDEZVOUS_TIMEOUT.total_seconds():.0f} s: {str(e).splitlines()[0][:300]}", status=504)
    finally:
        request.app["rendezvous_busy"] = False
    logger.info("joined weight update group %s as rank %d in %.2fs", name, rank, time.time() - t0)
    return web.json_response({"success": True, "message": f"Succeeded to initialize group {name!r} as rank {rank}."})


@routes.post("/destroy_weights_update_group")
async def destroy_weights_update_group(request):
    body = _typed(await _json(request), "/destroy_weights_update_group", {"group_name": (str,)})
    name = body.get("group_name", "weight_update_group")
    pg = request.app["weight_groups"].pop(name, None)
    if pg is None:
        raise BadRequest(f"no weight update group named {name!r}")
    process_group.destroy_process_group(pg)
    return web.json_response({"success": True, "message": f"destroyed {name!r}"})


@routes.post("/update_weights_from_distributed")
async def update_weights_from_distributed(request):
    path = "/update_weights_from_distributed"
    body = _typed(_fields(await _json(request), path,
                          {"names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests",
                           "weight_version", "load_format"}, {"names", "dtypes", "shapes"}),
                  path, {"names": (list,), "dtypes": (list,), "shapes": (list,), "group_name": (str,),
                         "weight_version": (str, int, type(None)), "load_format": (str, type(None))})
    if not all(isinstance(n, str) for n in body["names"] + body["dtypes"]):
        raise BadRequest(f"{path}: names and dtypes must be lists of strings")
    try:
        itemsizes = [process_group.torch_dtype(d).itemsize for d in body["dtypes"]]
    except ValueError as e:
        raise BadRequest(f"{path}: {e}") from None
    nbytes = sum(weights.numel(_int_list(shape, path, "each of shapes")) * size
                 for shape, size in zip(body["shapes"], itemsizes))
    if nbytes > _engine(request).max_payload_bytes:   # what receive_distributed would allocate
        raise BadRequest(f"{path}: the shapes hold {nbytes} bytes, more than the model's "
                         f"{_engine(request).max_payload_bytes}")
    eng = _engine(request)
    name = body.get("group_name", "weight_update_group")
    pg = request.app["weight_groups"].get(name)
    if pg is None:
        raise BadRequest(f"no weight update group {name!r}; call /init_weights_update_group first "
                         f"(known: {sorted(request.app['weight_groups'])})")
    names, dtypes, shapes = body["names"], body["dtypes"], body["shapes"]
    if not len(names) == len(dtypes) == len(shapes):
        raise BadRequest(f"names/dtypes/shapes lengths differ: {len(names)}/{len(dtypes)}/{len(shapes)}")
    if body.get("abort_all_requests"):
        eng.abort(abort_all=True)

    def receive_and_load():
        # Under the model lock: matching parameters are received in place (weights.receive_distributed).
        with eng.model_lock:
            received = weights.receive_distributed(eng.model, names, dtypes, shapes, body.get("load_format"),
                                                   lambda t: torch.distributed.broadcast(t, src=0, group=pg))
            return eng.update_weights(received, body.get("weight_version"))

    n = await _in_thread(receive_and_load)
    return web.json_response({"success": True, "message": f"Succeeded to update {n} parameter(s)."})


@routes.post("/weights_checker")
async def weights_checker(request):
    """SGLang's weight check (slime's --check-weight-update-equal): {"action": snapshot | reset_tensors | compare}."""
    body = _typed(_fields(await _json(request), "/weights_checker", {"action"}, {"action"}), "/weights_checker",
                  {"action": (str,)})
    ok, message = await _in_thread(_engine(request).check_weights, body["action"])
    if not ok:
        return _err(message, status=400)
    return web.json_response({"success": True, "message": message})


def _tags(body: dict, path: str) -> list[str]:
    tags = body.get("tags") or ["weights", "kv_cache"]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise BadRequest(f"{path}: tags must be a list of strings, got {str(tags)[:60]!r}")
    unknown = set(tags) - {"weights", "kv_cache", "cuda_graph"}
    if unknown:
        raise BadRequest(f"{path}: unknown tags {sorted(unknown)}; SGLang's are 'weights', 'kv_cache', 'cuda_graph'")
    return tags


@routes.post("/release_memory_occupation")
async def release_memory_occupation(request):
    # The CPU engine's only large allocation is its weights (KV rows live and die with their requests), so the
    # 'weights' tag (or no tags) frees them; 'kv_cache' / 'cuda_graph' alone have nothing to free.
    if "weights" in _tags(await _json(request), "/release_memory_occupation"):
        await _in_thread(_engine(request).release_memory)
    return web.json_response({"success": True})


@routes.post("/resume_memory_occupation")
async def resume_memory_occupation(request):
    if "weights" in _tags(await _json(request), "/resume_memory_occupation"):
        await _in_thread(_engine(request).resume_memory)
    return web.json_response({"success": True})


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

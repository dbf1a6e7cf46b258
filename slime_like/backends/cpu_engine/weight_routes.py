"""The CPU engine's weight and memory routes (SGLang's names): load from disk, from shared-memory tensors or from a
trainer's broadcast group, check weights, release / resume memory.

Blocking work (weight loading, receiving broadcasts, waiting for a group rendezvous) runs in worker threads so the
event loop keeps answering /health, /abort_request, /generate.
"""
from __future__ import annotations

import asyncio
import binascii
import pickle
import time
from datetime import timedelta

import torch
from aiohttp import web

from slime_like.backends.cpu_engine import weights
from slime_like.backends.cpu_engine.http_common import (
    _engine, _err, _fields, _in_thread, _int_list, _json, _typed, logger)
from slime_like.backends.engine_api import delta_pull, process_group, tensor_serializer
from slime_like.backends.engine_api.protocol import BadRequest

routes = web.RouteTableDef()
# A weight-sync rendezvous the trainer starts before calling: its store answers at once, the other engines join
# within seconds. Past this a master is unreachable (the route answers 504).
RENDEZVOUS_TIMEOUT = timedelta(seconds=60)


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


@routes.post("/pull_weights")
async def pull_weights(request):
    """SGLang's delta weight sync pull (slime's --update-weight-mode delta): the local checkpoint copy is brought to
    target_version from the deltas under source_dir (engine_api/delta_pull.py); the served weights are unchanged."""
    body = _typed(_fields(await _json(request), "/pull_weights",
                          {"local_checkpoint_dir", "source_dir", "target_version"},
                          {"local_checkpoint_dir", "source_dir", "target_version"}),
                  "/pull_weights", {"local_checkpoint_dir": (str,), "source_dir": (str,), "target_version": (int,)})
    eng, local, source = _engine(request), body["local_checkpoint_dir"], body["source_dir"]

    def pull():   # reads and writes only inside the engine's --weight-dirs; the served weights stay as they are
        for path in (local, source):
            weights.check_inside(path, eng.weight_dirs, "/pull_weights")
        return delta_pull.pull(local, source, body["target_version"], eng.served_model_path)

    n = await _in_thread(pull)
    return web.json_response({"success": True, "message": f"Local checkpoint at version {body['target_version']} "
                                                          f"({n} tensor(s) changed)."})


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

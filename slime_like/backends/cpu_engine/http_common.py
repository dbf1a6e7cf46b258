"""What every CPU-engine route shares: JSON errors, the API-key and error middlewares, body parsing and checks.

Errors are JSON ``{"error": {"message": ...}}`` with status 400, like SGLang's.
"""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from slime_like.backends.cpu_engine.engine import CPUEngine
from slime_like.backends.engine_api.protocol import BadRequest
from slime_like.utils import auth

logger = logging.getLogger("slime_like.cpu_engine")
# Largest request body (--max-request-bytes): a 512-prompt batch of 4k-token ids is ~12 MB of JSON; weight
# routes carry names and shared-memory handles, not tensors.
MAX_REQUEST_BYTES = 64 << 20


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

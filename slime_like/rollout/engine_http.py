"""``post`` / ``get`` as slime's custom generate functions call them (slime.utils.http_utils).

slime's functions build ``http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`` and ``post`` an
SGLang /generate body there. Inside a rollout such a request (to the router address in args -- ``None:None``
when the run starts no router -- or to any engine of the pool) goes through the rollout's engine pool: the run's
secret, fail-over, the abort of over-sampled requests and the token accounting apply as to our own requests.
Any other URL (a search server, a sandbox, a reward model) is a plain JSON POST with slime's retries.
"""
from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import aiohttp

from .engines import current_state

logger = logging.getLogger(__name__)

# /generate fields the pool forwards (it always asks for log-probs); others are refused, not dropped
_FORWARDED = {"input_ids", "text", "sampling_params", "return_logprob", "rid", "stream", "image_data"}


def _address(url: str) -> str:
    """host:port as written ("None:None" stays comparable: urlsplit's .port would raise on it)."""
    return urlsplit(url if "://" in url else "http://" + url).netloc.lower()


def _engine_addresses(state) -> set[str]:
    args, pool = state.args, state.pool
    found = {f"{args.sglang_router_ip}:{args.sglang_router_port}".lower()}   # "none:none" without a router
    found.update(_address(u) for u in [*pool.urls, *([pool.router] if getattr(pool, "router", None) else [])])
    return found


def _running_state():
    try:
        return current_state()
    except RuntimeError:
        return None


async def _generate_through_pool(state, payload: dict) -> dict:
    unknown = sorted(set(payload) - _FORWARDED)
    if unknown:
        raise ValueError(f"post(/generate): field(s) {unknown} are not supported by slime_like's engines "
                         f"(forwarded: {sorted(_FORWARDED)})")
    if payload.get("stream"):
        raise ValueError("post(/generate): stream=True is not supported; slime's post reads one JSON answer")
    if payload.get("input_ids") is not None:
        ids = payload["input_ids"]
    elif isinstance(payload.get("text"), str):
        ids = state.tokenizer(payload["text"], add_special_tokens=True)["input_ids"]   # as SGLang tokenizes text
    else:
        raise ValueError("post(/generate): give input_ids (a list of ints) or text (one string)")
    rid = payload.get("rid") or f"slime-post-{next(state._rid)}"
    images = payload.get("image_data")
    if images is not None and not isinstance(images, list):
        images = [images]   # SGLang takes one image as itself or a list of them
    return await state.pool.generate(list(ids), dict(payload.get("sampling_params") or {}), rid=rid,
                                     image_data=images)


async def post(url: str, payload: dict | None = None, max_retries: int = 60, headers: dict | None = None):
    """slime's ``post``: the rollout's engines for their /generate, else a JSON POST retried once a second."""
    state = _running_state()
    parts = urlsplit(url)
    if state is not None and parts.path.rstrip("/") == "/generate" and _address(url) in _engine_addresses(state):
        return await _generate_through_pool(state, payload or {})
    for attempt in range(1, max_retries + 1):
        try:
            async with aiohttp.ClientSession(trust_env=False) as session:
                async with session.post(url, json=payload or {}, headers=headers) as resp:
                    resp.raise_for_status()
                    body = await resp.read()
            try:
                return json.loads(body)
            except json.JSONDecodeError:
                return body.decode(errors="replace")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if attempt >= max_retries:
                raise
            logger.info("post %s failed (%s), retry %d/%d", url, exc, attempt, max_retries)
            await asyncio.sleep(1)


async def get(url: str):
    """slime's ``get``: one GET, the JSON answer."""
    async with aiohttp.ClientSession(trust_env=False) as session:
        async with session.get(url) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

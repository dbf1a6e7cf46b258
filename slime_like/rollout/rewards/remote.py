"""``--rm-type remote_rm``: POST each sample to a reward server at ``--rm-url``.

Request body (slime's): ``{"prompt", "response", "label"}`` plus ``"metadata"``; the reply's JSON
is the reward (a number, or a dict selected with ``--reward-key``).
Timeout per attempt ``--rm-timeout`` seconds (default 60); up to ``--rm-max-retries`` attempts
(default 5) with exponential back-off ``--rm-retry-backoff * 2**attempt`` seconds (default 0.5,
capped at 30) plus jitter, because reward servers are often briefly overloaded. When every attempt
fails the error names the URL, the attempts and the last failure.
"""
from __future__ import annotations

import asyncio
import logging
import random

import aiohttp

logger = logging.getLogger(__name__)


class RemoteRewardError(RuntimeError):
    pass


def _payload(sample) -> dict:
    return {"prompt": sample.prompt, "response": sample.response, "label": sample.label,
            "metadata": sample.metadata}


async def remote_rm(args, sample, session: aiohttp.ClientSession | None = None):
    url = getattr(args, "rm_url", None)
    if not url:
        raise ValueError("--rm-type remote_rm needs --rm-url http://HOST:PORT/PATH of the reward server")
    attempts = int(getattr(args, "rm_max_retries", None) or 5)
    backoff = float(getattr(args, "rm_retry_backoff", None) or 0.5)
    timeout = aiohttp.ClientTimeout(total=float(getattr(args, "rm_timeout", None) or 60))
    own_session = session is None
    if own_session:
        session = aiohttp.ClientSession(timeout=timeout)
    last_error: BaseException | None = None
    try:
        for attempt in range(attempts):
            try:
                async with session.post(url, json=_payload(sample), timeout=timeout) as resp:
                    if resp.status >= 400:
                        body = (await resp.text())[:200]
                        raise RemoteRewardError(f"HTTP {resp.status}: {body}")
                    return await resp.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, RemoteRewardError, ValueError) as exc:
                last_error = exc
                if attempt + 1 < attempts:
                    delay = min(backoff * 2 ** attempt, 30.0) * (1 + 0.1 * random.random())
                    logger.warning("remote_rm %s: %s; retry %d/%d in %.2fs", url, exc, attempt + 1,
                                   attempts - 1, delay)
                    await asyncio.sleep(delay)
    finally:
        if own_session:
            await session.close()
    raise RemoteRewardError(f"reward server --rm-url {url} failed {attempts} attempts for sample "
                            f"{sample.index} (prompt {sample.group_index}); last error: {last_error!r}. "
                            f"Is the server up? (raise --rm-max-retries / --rm-timeout if it is just slow)")

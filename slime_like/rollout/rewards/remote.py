"""``--rm-type remote_rm``: POST each sample to a reward server at ``--rm-url``.

Request body (slime's): ``{"prompt", "response", "label"}`` plus ``"metadata"``; the reply's JSON
is the reward (a number, or a dict selected with ``--reward-key``).
Timeout per attempt ``--rm-timeout`` seconds (default 60); up to ``--rm-max-retries`` attempts per sample
(default 10) with exponential back-off ``--rm-retry-backoff * 2**attempt`` seconds (default 0.5, capped at 30)
plus jitter, because reward servers are often briefly overloaded. Across one rollout the
retries share a budget (``--rm-retry-budget``, default twice the rollout's samples) and a circuit breaker
opens after ``--rm-circuit-breaker`` failures in a row with no success between them (default 20): a server
failing 30 % of its requests completes the run, a dead one stops it in seconds. Retry warnings are
rate-limited (one line per 10 s with the count). When a sample gives up, the error names the URL, the
attempts and the last failure.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref

import aiohttp

logger = logging.getLogger(__name__)
WARN_EVERY_S = 10.0
_BUDGETS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # one rollout -> its _Breaker


class RemoteRewardError(RuntimeError):
    pass


class _Breaker:
    """One rollout's retry budget and circuit breaker for the reward server, and its rate-limited warnings."""

    def __init__(self, url: str, budget: int, trip_after: int):
        self.url, self.retries_left, self.trip_after = url, budget, trip_after
        self.in_a_row = self.retries = self.unreported = 0
        self.last_warn = float("-inf")

    def succeeded(self) -> None:
        self.in_a_row = 0

    def failed(self, exc: BaseException) -> None:
        """Count one failed attempt; raise when the circuit opens or the rollout's budget is spent."""
        self.in_a_row += 1
        if self.in_a_row >= self.trip_after:
            raise RemoteRewardError(f"reward server --rm-url {self.url}: {self.in_a_row} failures in a row with no "
                                    f"success (--rm-circuit-breaker {self.trip_after}); last error: {exc!r}. Is the "
                                    f"server up?")
        if self.retries_left <= 0:
            raise RemoteRewardError(f"reward server --rm-url {self.url}: this rollout's retry budget is spent "
                                    f"({self.retries} retries, --rm-retry-budget); last error: {exc!r}")
        self.retries_left -= 1
        self.retries += 1
        self.unreported += 1
        now = time.monotonic()
        if now - self.last_warn >= WARN_EVERY_S:
            logger.warning("remote_rm %s: %d failed attempt(s) retried since the last report (%d this rollout, "
                           "%d retries left); last: %s", self.url, self.unreported, self.retries, self.retries_left,
                           exc)
            self.last_warn, self.unreported = now, 0


def _rollout_key():
    """What one rollout shares: its GenerateState (the controller keeps one event loop for the whole run), or
    the event loop when rewards are computed outside a rollout."""
    from ..engines import current_state

    try:
        return current_state()
    except RuntimeError:
        return asyncio.get_running_loop()


def _breaker(args, url: str) -> _Breaker:
    loop = _rollout_key()
    if loop not in _BUDGETS:
        budget = args.rm_retry_budget
        if budget is None:
            n = args.rollout_batch_size * args.n_samples_per_prompt
            budget = 2 * n
        _BUDGETS[loop] = _Breaker(url, int(budget), int(args.rm_circuit_breaker))
    return _BUDGETS[loop]


def _payload(sample) -> dict:
    return {"prompt": sample.prompt, "response": sample.response, "label": sample.label,
            "metadata": sample.metadata}


async def remote_rm(args, sample, session: aiohttp.ClientSession | None = None):
    url = args.rm_url
    if not url:
        raise ValueError("--rm-type remote_rm needs --rm-url http://HOST:PORT/PATH of the reward server")
    attempts = int(args.rm_max_retries)
    breaker = _breaker(args, url)
    backoff = float(args.rm_retry_backoff)
    timeout = aiohttp.ClientTimeout(total=float(args.rm_timeout))
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
                    answer = await resp.json(content_type=None)
                breaker.succeeded()
                return answer
            except (aiohttp.ClientError, asyncio.TimeoutError, RemoteRewardError, ValueError) as exc:
                last_error = exc
                if attempt + 1 < attempts:
                    breaker.failed(exc)   # raises when the circuit opens or the rollout's budget is spent
                    # full jitter: many samples failing together do not retry in lockstep
                    await asyncio.sleep(min(backoff * 2 ** attempt, 30.0) * random.uniform(0.5, 1.5))
    finally:
        if own_session:
            await session.close()
    raise RemoteRewardError(f"reward server --rm-url {url} failed {attempts} attempts for sample "
                            f"{sample.index} (prompt {sample.group_index}); last error: {last_error!r}. "
                            f"Is the server up? (raise --rm-max-retries / --rm-timeout if it is just slow)")

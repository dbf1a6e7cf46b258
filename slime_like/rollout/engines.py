"""The rollout's view of the engines: several SGLang-protocol URLs, least-loaded choice, fail-over.

Requests go to the live engine with the fewest prompts in flight (ties: round-robin order). An
engine that stops answering (connection refused / reset / timeout: ``EngineUnreachable``) is marked
dead for the rest of the run and the request is sent again, unchanged, to another engine: the
sample is only updated from a successful answer, so a retried request is never counted twice.
When no engine is left the rollout fails naming every dead address and its last error.
An engine that answers with an HTTP error (a bad request) is not retried: that error is raised.

A hung engine (e.g. SIGSTOPped: its port accepts connections but nothing answers) is caught twice: every
request has a timeout derived from its decode length (``request_timeout``, or --rollout-request-timeout), and
a watchdog asks every live engine for ``/health`` each --rollout-health-check-interval seconds; one silent
for --rollout-health-check-timeout seconds is marked dead and its in-flight requests move to a live engine
at once (with one engine, the rollout fails with NoEngineLeft naming it instead of hanging). The first check of
each rollout waits --rollout-health-check-first-wait seconds (slime's grace for engines still compiling).

Under --use-fault-tolerance the Ray layer restarts a dead engine between rollouts, pushes the current weights to
it, and only then hands its URL to ``replace_engine``: the pool never sends a request to an engine that has not
got the trainer's weights.

Behind an sglang router (``router=``) every /generate goes to the router, which picks the engine; the pool still
health-checks each engine itself. One found dead is removed from the router at once (then its requests can only
go to the others), and every request in flight through the router at that moment is sent again: the pool cannot
tell which of them the router gave to the dead engine. A restarted engine joins the router in ``replace_engine``.
"""
from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging

import aiohttp

from ..backends.engine_api.client import EngineClient, EngineError, EngineUnreachable
from ..backends.sglang import router as sglang_router

logger = logging.getLogger(__name__)


class NoEngineLeft(RuntimeError):
    pass


def request_timeout(args) -> float:
    """Seconds one /generate may take: --rollout-request-timeout, else derived from the expected decode time
    (a generous 0.25 s per token of --rollout-max-response-len, queueing behind a full batch included, + 120 s)."""
    explicit = args.rollout_request_timeout
    if explicit:
        return float(explicit)
    return 120.0 + 0.25 * float(args.rollout_max_response_len or 1024)


class EnginePool:
    NO_ENGINES = "no rollout engine URLs (the engines did not start, or --rollout-external-engine-addrs is empty)"

    def __init__(self, urls: list[str], dead: dict | None = None, timeout: float | None = 3600.0,
                 api_key: str | None = None, health_interval: float | None = None, health_timeout: float = 30.0,
                 allow_empty: bool = False, health_first_wait: float = 0.0, router: str | None = None):
        if not urls and not allow_empty:  # allow_empty: a rollout that generates nothing (SFT, --debug-train-only)
            raise ValueError(self.NO_ENGINES)
        self.urls = list(urls)              # the engines (health-checked, taken out, replaced)
        self.router = router                # where /generate goes when set (docstring above)
        self.dead: dict[str, str] = dead if dead is not None else {}   # url -> last error, shared across runs
        self._timeout = timeout
        self._api_key = api_key
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self.clients: dict[str, EngineClient] = {}
        self.answered = {u: 0 for u in self.targets}   # successful /generate answers per target (this rollout)
        self.in_flight = {u: 0 for u in self.targets}
        self._rr = itertools.count()
        self.tokens_generated = 0          # output tokens of successful answers (for tokens/s)
        self._health = (health_interval, health_timeout, health_first_wait or 0.0)
        self._dead_events: dict[str, asyncio.Event] = {}   # router: set (and renewed) when an engine is taken out
        self._takeouts: dict[str, asyncio.Task] = {}       # router: the removal of each dead engine from it
        self._watchdog: asyncio.Task | None = None
        self.request_extras: dict = {}     # extra /generate fields of every request (return_routed_experts)

    @property
    def targets(self) -> list[str]:
        """Where /generate goes: the router, else every engine."""
        return [self.router] if self.router else self.urls

    async def __aenter__(self):
        # One connection pool per engine, kept open as long as the pool (the rollout controller keeps it for
        # the run); no per-connection limit (the rollout's semaphore bounds concurrency).
        for u in self.urls + ([self.router] if self.router else []):
            self._open(u)
        return self

    def _open(self, url: str) -> None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                        timeout=aiohttp.ClientTimeout(total=self._timeout))
        self._sessions[url] = session
        self.clients[url] = EngineClient(url, session=session, timeout=self._timeout, api_key=self._api_key)
        self._dead_events[url] = asyncio.Event()

    async def __aexit__(self, *exc):
        await self.stop_watchdog()
        for session in self._sessions.values():
            await session.close()
        self._sessions = {}

    async def replace_engine(self, old_url: str, new_url: str) -> None:
        """Put `new_url` (a restarted engine, already on the current weights) in the place of `old_url`."""
        if old_url not in self.urls:
            raise ValueError(f"cannot replace rollout engine {old_url}: the pool has {self.urls}")
        if self.in_flight.get(old_url):
            raise RuntimeError(f"rollout engine {old_url} still has {self.in_flight[old_url]} request(s) in flight")
        if self.router:   # it holds the current weights now: the router may send it requests
            self._takeouts.pop(old_url, None)
            # removed again in case its take-out was cut short (a rollout's end cancels what still runs)
            await asyncio.to_thread(sglang_router.remove_worker, self.router, old_url, self._api_key)
            await asyncio.to_thread(sglang_router.add_worker, self.router, new_url, self._api_key)
        self.urls[self.urls.index(old_url)] = new_url
        self.dead.pop(old_url, None)
        for table in (self.in_flight, self.answered, self.clients, self._dead_events):
            table.pop(old_url, None)
        session = self._sessions.pop(old_url, None)
        if session is not None:
            await session.close()
        if not self.router:
            self.in_flight[new_url], self.answered[new_url] = 0, 0
        self._open(new_url)
        logger.warning("rollout engine %s replaced by the restarted engine %s; %d engine(s) live",
                       old_url, new_url, len(self.alive))

    def start_watchdog(self) -> None:
        """Health-check the live engines until stop_watchdog (the controller runs it for each rollout)."""
        if self._health[0] and self._watchdog is None:
            self._watchdog = asyncio.ensure_future(self._watch())

    async def stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
            self._watchdog = None

    def _mark_dead(self, url: str, reason: str) -> None:
        if url not in self.dead:
            self.dead[url] = reason
            logger.error("rollout engine %s stopped answering (%s); %d engine(s) left, retrying its requests there",
                         url, reason, len(self.alive))
            if self.router:
                self._takeouts[url] = asyncio.ensure_future(self._take_out(url))
        if not self.router:
            self._dead_events[url].set()   # wakes the requests waiting on it

    async def _take_out(self, url: str) -> None:
        """Remove a dead engine from the router, then resend what was in flight through the router."""
        try:
            await asyncio.to_thread(sglang_router.remove_worker, self.router, url, self._api_key)
            logger.warning("rollout engine %s removed from the router %s", url, self.router)
        except Exception as e:  # noqa: BLE001 - the router's own health check still stops routing to it
            logger.error("could not remove the dead rollout engine %s from the router %s: %s", url, self.router, e)
        died, self._dead_events[self.router] = self._dead_events[self.router], asyncio.Event()
        died.set()

    async def _watch(self) -> None:
        interval, _, first_wait = self._health
        await asyncio.sleep(first_wait)
        while True:
            await asyncio.sleep(interval)
            await self.probe()

    async def probe(self) -> None:
        """Ask every live engine for /health once; one silent for --rollout-health-check-timeout is marked dead."""
        timeout = self._health[1]

        async def one(url):
            if not await self.clients[url].health(generate=False, timeout=timeout):
                self._mark_dead(url, f"no answer to /health within {timeout:g}s (--rollout-health-check-timeout)")
        await asyncio.gather(*(one(u) for u in self.alive))
        await asyncio.gather(*map(asyncio.shield, self._takeouts.values()))   # a cancelled watchdog leaves them be

    async def _on(self, url: str, coro, event: asyncio.Event):
        """Await `coro` (a request to `url`) unless `event` is set first (`url` marked dead; behind a router, an
        engine taken out of it): then EngineUnreachable."""
        request = asyncio.ensure_future(coro)
        dead = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({request, dead}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dead.cancel()
            if not request.done():
                request.cancel()
        if not request.done() or request.cancelled():
            raise EngineUnreachable(url, self.dead.get(url, "marked dead"))
        return request.result()

    @property
    def alive(self) -> list[str]:
        return [u for u in self.urls if u not in self.dead]

    def _pick(self) -> str:
        if not self.urls:
            raise ValueError(self.NO_ENGINES)
        alive = self.alive
        if not alive:
            raise NoEngineLeft("every rollout engine is down: " + "; ".join(f"{u}: {e}" for u, e in self.dead.items()))
        if self.router:
            return self.router
        start = next(self._rr) % len(alive)
        rotated = alive[start:] + alive[:start]
        return min(rotated, key=lambda u: self.in_flight[u])

    async def generate(self, input_ids: list[int] | list[list[int]], sampling_params: dict | list[dict],
                       rid: str | list[str] | None = None, image_data: list | None = None) -> dict | list[dict]:
        """One /generate call (a list of prompts: SGLang's batch form, answered by a list) with fail-over.
        ``image_data``: SGLang's field, the prompt's images (data URLs), for a batch one list per prompt; sent
        only when some prompt has an image."""
        n = len(input_ids) if input_ids and isinstance(input_ids[0], list) else 1   # load = prompts in flight
        extras = dict(self.request_extras)
        if image_data and any(image_data):
            extras["image_data"] = image_data
        while True:
            url = self._pick()
            event = self._dead_events[url]   # behind a router: this request's, renewed at each take-out
            self.in_flight[url] += n
            try:
                out = await self._on(url, self.clients[url].generate(input_ids, sampling_params, return_logprob=True,
                                                                     rid=rid, **extras), event)
                self.answered[url] += 1
                for o in (out if isinstance(out, list) else [out]):
                    self.tokens_generated += int((o.get("meta_info") or {}).get("completion_tokens") or 0)
                return out
            except EngineError as exc:
                if not self.router:
                    if not isinstance(exc, EngineUnreachable):
                        raise
                    self._mark_dead(url, str(exc))
                elif not await self._engine_taken_out(exc, event):
                    raise
            finally:
                self.in_flight[url] -= n

    async def _engine_taken_out(self, exc: EngineError, event: asyncio.Event) -> bool:
        """Behind a router: True when an engine was taken out while the request was in flight (send it again);
        a router error answer (5xx) first checks every engine, since it may come from one that just died."""
        if isinstance(exc, EngineUnreachable) and not event.is_set():
            raise NoEngineLeft(f"the sglang router {self.router} stopped answering: {exc.message}") from exc
        if not event.is_set() and (exc.status or 0) >= 500:
            await self.probe()
        return event.is_set()

    async def abort_all(self) -> None:
        async def one(url):
            try:
                await self.clients[url].abort()
            except EngineUnreachable as exc:
                self.dead.setdefault(url, str(exc))
        await asyncio.gather(*(one(u) for u in self.alive))


# The pool (and the rest of a rollout's shared state) of the rollout running in this task tree.
_CURRENT = contextvars.ContextVar("slime_like_rollout_state", default=None)


def current_state():
    """The running rollout's GenerateState (custom generate / rollout functions call its methods)."""
    state = _CURRENT.get()
    if state is None:
        raise RuntimeError("no rollout is running: current_state() is only available inside a rollout "
                           "(generate_rollout / a --custom-generate-function-path function)")
    return state


def set_current_state(state):
    return _CURRENT.set(state)

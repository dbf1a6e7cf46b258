"""Fully asynchronous rollout (slime's ``fully_async_rollout``, AReaL-style staleness control).

Enabled as in slime: ``python train_async.py --rollout-function-path
slime.rollout.fully_async_rollout.generate_rollout_fully_async`` (or this module's
``slime_like.rollout.fully_async.generate_rollout_fully_async``).

A ``FullyAsyncWorker`` (a thread running its own asyncio loop, an engine pool of its own) generates groups
continuously, one prompt group at a time, into a bounded buffer; each training step takes
``--rollout-batch-size`` finished groups from it (``take``) while generation goes on.

Weight pushes happen while the worker runs: the driver calls ``pause_for_weight_update`` before the push and
``resume_after_weight_update(version)`` after it (the rollout manager forwards both). In between no request is
in flight: without ``--partial-rollout`` the running groups finish on the old weights (drained); with it they
are aborted (/abort_request), keep their partial responses and continue on the new weights afterwards.

Versions: the run pushes ``weight_version = str(k)`` for the weights after k training steps; every engine
answer's version lands in ``Sample.weight_versions``. A group's version is its oldest one. The trainer at step t
accepts a group only if ``t - version <= --max-staleness``: staler groups are dropped when found (at a push or
at ``take``) and their prompts generated again from scratch (same group index; never lost, never trained twice).
Start gate (AReaL's): a new group is started only while ``accepted < (v - v0 + S + 1) * B`` (v the engines'
version, v0 the first, S = --max-staleness, B = --rollout-batch-size, accepted = groups started and not
dropped), so the buffer (finished + running groups not yet trained) never exceeds (S + 1) * B groups and
drops are rare.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time

from ..sample import Status
from .engines import EnginePool, current_state, request_timeout, set_current_state
from .eval import eval_rollout
from .filters import decide
from .generate import RolloutOutput
from .generate_group import GenerateState, generate_group, reset_sample, sampling_params_from_args
from .hooks import load_function
from .serialize import sample_to_dict

logger = logging.getLogger(__name__)

_worker: "FullyAsyncWorker | None" = None   # one per rollout-manager process, across rollouts
_worker_lock = threading.Lock()
_known_version = 0    # the last version pushed to the engines (the first push comes before the worker starts)


def group_version(group, default: int) -> int:
    """The oldest policy version that wrote any of the group's tokens (engine answers that carry no integer
    version, e.g. an engine never pushed to, count as `default`: the version the worker knew at the time)."""
    versions = [int(v) for s in group for v in s.weight_versions if str(v).lstrip("-").isdigit()]
    return min(versions) if versions else default


class FullyAsyncWorker:
    def __init__(self, args, data_source, urls: list[str], tokenizer, start_version: int, router: str | None = None):
        self.args, self.data_source = args, data_source
        self.batch = int(args.rollout_batch_size)
        self.max_staleness = int(args.max_staleness)
        self.partial = bool(args.partial_rollout)
        self.version = self.start_version = int(start_version)
        self.params = sampling_params_from_args(args)
        filter_path = args.dynamic_sampling_filter_path
        self.filter_fn = load_function(filter_path, "--dynamic-sampling-filter-path") if filter_path else None
        self.ready: list[list] = []              # finished, scored groups not yet taken (completion order)
        self.resume: list[list] = []             # aborted for a weight push: continue first (--partial-rollout)
        self.running: dict[asyncio.Task, list] = {}
        self.started_version: dict[int, int] = {}   # id(group) -> the version the worker knew at its start
        self.accepted = 0
        self.paused = False
        self.error: BaseException | None = None
        self.counts = {"dropped_stale": 0, "resumed_partial": 0, "filtered": 0, "failed": 0, "aborted_restart": 0}
        self.filtered_groups: list[list] = []    # for --rollout-all-samples-process-path at the next take
        self._urls, self._tokenizer, self._router = list(urls), tokenizer, router
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fully-async-rollout", daemon=True)
        self._thread.start()
        self.call(self._open())
        self._producer = asyncio.run_coroutine_threadsafe(self._produce(), self.loop)

    # ---------------------------------------------------------------- called from other threads
    def call(self, coro, timeout: float | None = None):
        """Run `coro` on the worker's loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self):
        async def close():
            producer = asyncio.wrap_future(self._producer)
            self._producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            await self._quiesce(abort=True)
            await self.pool.__aexit__(None, None, None)
        try:
            self.call(close(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    # ---------------------------------------------------------------- the loop's side
    async def _open(self):
        args = self.args
        self.pool = await EnginePool(
            self._urls, timeout=request_timeout(args), api_key=args.engine_api_key,
            health_interval=args.rollout_health_check_interval,
            health_timeout=args.rollout_health_check_timeout,
            health_first_wait=args.rollout_health_check_first_wait, router=self._router).__aenter__()
        self.state = GenerateState(args, self.pool, self._tokenizer)
        self.pool.start_watchdog()
        self._wake = asyncio.Event()
        self._last_tokens = (time.perf_counter(), 0)
        self._last_answered: dict = {}   # the pool's answers per engine at the previous batch

    def _may_start(self) -> bool:
        limit = (self.version - self.start_version + self.max_staleness + 1) * self.batch
        return not self.paused and self.error is None and self.accepted < limit

    async def _produce(self):
        set_current_state(self.state)   # generate_group reaches the engines through current_state()
        try:
            await self._generate_forever()
        except asyncio.CancelledError:
            raise
        except BaseException as e:      # e.g. the prompt data ran out or a data source hook raised: take raises it
            self.error = e

    async def _generate_forever(self):
        while True:
            while self._may_start():
                if self.resume:
                    group = self.resume.pop(0)
                    self.counts["resumed_partial"] += 1
                else:
                    group = self.data_source.get_samples(1)[0]
                    self.accepted += 1
                self.started_version.setdefault(id(group), self.version)
                self.running[asyncio.ensure_future(generate_group(self.args, group, self.params))] = group
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait([*self.running, woken], return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
            self._collect()

    def _collect(self):
        """Move finished tasks' groups where they belong; the first error stops generation (take raises it)."""
        for task in [t for t in self.running if t.done()]:
            group = self.running.pop(task)
            if task.cancelled():
                continue
            if task.exception() is not None:
                self.error = self.error or task.exception()
                continue
            if any(s.status == Status.ABORTED for s in group):
                if self.partial and self.paused:
                    self.resume.append(group)          # continues on the new weights after the push
                else:                                  # aborted by the engine for another reason: start over
                    self._requeue(group, "aborted_restart")
            elif any(s.status == Status.FAILED for s in group):
                self._forget(group, "failed")
            elif self.filter_fn is not None and not decide(self.filter_fn, self.args, group).keep:
                self._forget(group, "filtered")
                self.filtered_groups.append(group)
            else:
                self.ready.append(group)

    def _forget(self, group, count: str):
        """A group that will never be trained (failed / filtered): a new prompt may start in its place."""
        self.counts[count] += 1
        self.accepted -= 1
        self.started_version.pop(id(group), None)

    def _requeue(self, group, count: str):
        """Generate this prompt again from scratch: the group goes back to the data source's buffer."""
        for s in group:
            reset_sample(s)
        self._forget(group, count)
        self.data_source.add_samples([group])

    def _version_of(self, group) -> int:
        return group_version(group, self.started_version.get(id(group), self.version))

    def _drop_stale(self, step: int):
        """Requeue every finished group more than --max-staleness versions behind training step `step`."""
        keep = []
        for group in self.ready:
            if step - self._version_of(group) > self.max_staleness:
                self._requeue(group, "dropped_stale")
            else:
                keep.append(group)
        self.ready = keep

    async def _quiesce(self, abort: bool):
        """Nothing in flight afterwards: running groups finish (drain) or are aborted first."""
        if abort and self.running:
            self.state.aborted = True
            await self.pool.abort_all()
        if self.running:
            await asyncio.wait(list(self.running))
        self._collect()

    async def _pause(self):
        self.paused = True
        t = time.perf_counter()
        await self._quiesce(abort=self.partial)
        return time.perf_counter() - t

    async def _resume(self, version: int):
        self.version = int(version)
        self.state.aborted = False
        self._drop_stale(self.version)   # training is at least at this version from now on
        self.paused = False
        self._wake.set()

    async def take(self, rollout_id: int):
        """`--rollout-batch-size` finished groups for training step `rollout_id` (waits for them)."""
        t, staleness = time.perf_counter(), []
        while True:
            if self.error is not None:
                raise self.error
            self._drop_stale(rollout_id)
            if len(self.ready) >= self.batch:
                break
            self._wake.set()   # drops free start slots
            await asyncio.sleep(0.02)
        groups, self.ready = self.ready[:self.batch], self.ready[self.batch:]
        for g in groups:
            staleness.append(rollout_id - self._version_of(g))
            self.started_version.pop(id(g), None)
        filtered, self.filtered_groups = self.filtered_groups, []
        self._wake.set()
        _post_rollout_hooks(self.args, groups, filtered, self.data_source)   # here: the data source's thread
        now, tokens = time.perf_counter(), self.pool.tokens_generated
        rate = (tokens - self._last_tokens[1]) / max(now - self._last_tokens[0], 1e-9)
        self._last_tokens = (now, tokens)
        metrics = {"rollout/tokens_per_s": rate, "rollout/staleness/mean": sum(staleness) / len(staleness),
                   "rollout/staleness/max": max(staleness), "rollout/engines_live": len(self.pool.alive),
                   "rollout/wait_s": time.perf_counter() - t, "rollout/buffer_groups": len(self.ready),
                   "rollout/running_groups": len(self.running), "rollout/weight_version": self.version,
                   **{f"rollout/{k}": v for k, v in self.counts.items()}}
        # the engines that answered since the previous batch (--use-fault-tolerance: a restarted engine is back in
        # this pool after the push that restarted it); behind a router only the router knows, as in controller.py
        answered, self._last_answered = self._last_answered, dict(self.pool.answered)
        if not self.pool.router:
            metrics["rollout/engines_answering"] = sum(n > answered.get(u, 0) for u, n in self.pool.answered.items())
        return sorted(groups, key=lambda g: g[0].group_index), metrics

    async def pending_state(self) -> list:
        """Every prompt taken from the data source and not trained yet, as fresh prompts (for a checkpoint)."""
        groups = [copy.deepcopy(g) for g in (*self.resume, *self.ready, *self.running.values())]
        for g in groups:
            for s in g:
                reset_sample(s)
        return sorted(groups, key=lambda g: g[0].group_index)


def get_worker(args, data_source) -> FullyAsyncWorker:
    """The process's worker, started at the first rollout from the controller's engines and tokenizer."""
    global _worker
    with _worker_lock:
        if _worker is None:
            state = current_state()
            _worker = FullyAsyncWorker(args, data_source, state.pool.urls, state.tokenizer, _known_version,
                                       router=state.pool.router)
        return _worker


def active_worker() -> FullyAsyncWorker | None:
    return _worker


def stop_worker() -> None:
    global _worker, _known_version
    _known_version = 0
    with _worker_lock:
        if _worker is not None:
            try:
                _worker.stop()
            finally:
                _worker = None


def pause_for_weight_update() -> float:
    """Blocks until no request is in flight (seconds it took); no-op when no worker runs."""
    return _worker.call(_worker._pause()) if _worker is not None else 0.0


def resume_after_weight_update(version: int) -> None:
    global _known_version
    _known_version = int(version)
    if _worker is not None:
        _worker.call(_worker._resume(version))


def dead_engines() -> dict:
    """{URL: last error} of the engines the worker's pool found dead ({} when no worker runs)."""
    return dict(_worker.pool.dead) if _worker is not None else {}


def replace_engines(replaced: dict) -> None:
    """--use-fault-tolerance, during a weight push (paused: nothing in flight): restarted engines join the pool."""
    if _worker is not None:
        for old, new in replaced.items():
            if old in _worker.pool.urls:
                _worker.call(_worker.pool.replace_engine(old, new))


def checkpoint_state(data_source) -> dict | None:
    """The data source's state with the worker's untrained prompts put back in front of its buffer, so a
    resumed run generates them again (never lost); taken on the worker's loop, where the data source lives."""
    async def snapshot():
        state = data_source.state_dict()
        pending = await _worker.pending_state()
        if pending and "buffer" not in state:
            raise RuntimeError("fully async rollout: the --data-source-path state_dict() has no 'buffer' list, so "
                               f"the {len(pending)} prompt group(s) generating now cannot be saved with it")
        if pending:
            state["buffer"] = [[sample_to_dict(s) for s in g] for g in pending] + list(state["buffer"])
        return state
    return _worker.call(snapshot()) if _worker is not None else None


def _post_rollout_hooks(args, groups: list, filtered: list, data_source) -> None:
    """slime's post-rollout hooks, as generate_rollout calls them."""
    if args.rollout_sample_filter_path:
        load_function(args.rollout_sample_filter_path, "--rollout-sample-filter-path")(args, groups)
    if args.rollout_all_samples_process_path:
        all_groups = sorted(groups + filtered, key=lambda g: g[0].group_index)
        load_function(args.rollout_all_samples_process_path, "--rollout-all-samples-process-path")(
            args, all_groups, data_source)


async def generate_rollout_fully_async(args, rollout_id: int, data_source, evaluation: bool = False):
    """``--rollout-function-path``: this step's groups from the background worker (evaluation: the usual
    eval rollout, on the engines' current weights, next to the worker's requests)."""
    if evaluation:
        return await eval_rollout(args, rollout_id)
    worker = get_worker(args, data_source)
    groups, metrics = await asyncio.wrap_future(worker.submit(worker.take(rollout_id)))
    return RolloutOutput(groups=groups, metrics=metrics)

"""RolloutController: everything the rollout side does for the training loop, as a plain class.

    ctl = RolloutController(args, engine_urls)        # the Ray layer wraps it in an actor (router_url=: /generate
                                                      # goes there, the engines are still health-checked)
    samples, metrics = ctl.generate(rollout_id)       # scored samples of one rollout (whole groups)
    metrics = ctl.evaluate(rollout_id)                # eval/<name>/... per --eval-prompt-data dataset
    state = ctl.state_dict(); ctl.load_state_dict(state)   # the data source position + partial buffer

Each call runs its own asyncio loop (``asyncio.run``), so it must not be called from inside a
running event loop. ``--save-debug-rollout-data PATH`` writes each rollout's samples as JSON (``{rollout_id}``
in PATH is substituted; debug_data.py); ``--load-debug-rollout-data PATH`` replays them instead of generating
(no engines or prompt data needed). A tqdm bar counts finished samples when stderr is a terminal
(``--disable-tqdm`` / env ``SLIME_LIKE_NO_TQDM=1`` turns it off).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import time

from ..sample import Status
from . import fully_async
from .data_source import RolloutDataSource
from .debug_data import load_rollout, save_rollout
from .engines import EnginePool, request_timeout, set_current_state
from .eval import eval_datasets, eval_metrics, ks_for, pass_at_k
from .generate import RolloutOutput, as_rollout_output
from .generate_group import GenerateState
from .hooks import load_function
from .log_extras import correct_sample_metrics, multi_turn_metrics
from .rewards import scalar_reward

logger = logging.getLogger(__name__)


def load_tokenizer(args):
    from transformers import AutoTokenizer

    path = args.hf_checkpoint
    if not path:
        raise ValueError("--hf-checkpoint is required: the rollout tokenizes prompts with its tokenizer")
    return AutoTokenizer.from_pretrained(path, trust_remote_code=bool(args.trust_remote_code))


def rollout_metrics(args, samples, elapsed: float, tokens_generated: int) -> dict:
    rewards = [scalar_reward(args, s.reward) for s in samples]
    lengths = [s.response_length for s in samples]
    n = max(len(samples), 1)
    return {"rollout/reward": sum(rewards) / n,
            "rollout/response_len/mean": sum(lengths) / n, "rollout/response_len/max": max(lengths, default=0),
            "rollout/truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / n,
            "rollout/num_samples": len(samples), "rollout/time_s": elapsed,
            "rollout/tokens_per_s": tokens_generated / elapsed if elapsed > 0 else 0.0}


def category_metrics(args, samples) -> dict:
    """--log-reward-category KEY: share of each value of ``reward[KEY]`` (dict rewards), e.g. a failure reason."""
    key = args.log_reward_category
    if not key or not samples:
        return {}
    values = [str(s.reward.get(key)) if isinstance(s.reward, dict) else "None" for s in samples]
    return {f"rollout/{key}/{v}": values.count(v) / len(values) for v in sorted(set(values))}


def passrate_metrics(args, groups) -> dict:
    """--log-passrate: pass@k over the rollout's groups (a sample with reward > 0 passes)."""
    if not groups:
        return {}
    n = min(len(g) for g in groups)
    out = {}
    for k in ks_for(n):
        out[f"rollout/pass@{k}"] = sum(
            pass_at_k(len(g), sum(scalar_reward(args, s.reward) > 0 for s in g), k) for g in groups) / len(groups)
    return out


class RolloutController:
    def __init__(self, args, engine_urls: list[str], tokenizer=None, router_url: str | None = None):
        self.args, self.engine_urls, self.router_url = args, list(engine_urls or []), router_url
        self.debug_load = args.load_debug_rollout_data
        self.dead_engines: dict[str, str] = {}     # survives across rollouts: a dead engine stays dead
        # One event loop and one engine pool (an HTTP connection pool per engine) for the whole run: a fresh
        # loop per rollout opened new TCP connections to every engine each time (~20 ms of ~65 ms per demo step)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: EnginePool | None = None
        self._side_session = None   # run-wide connections to engines the pool does not serve (behind a router)
        self.tokenizer = None
        self.data_source = None
        if self.debug_load:
            return
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(args)
        self.rollout_fn = load_function(args.rollout_function_path,
                                        "--rollout-function-path")
        eval_path = args.eval_function_path
        self.eval_fn = load_function(eval_path, "--eval-function-path") if eval_path else self.rollout_fn
        custom_ds = args.data_source_path
        if custom_ds:
            self.data_source = load_function(custom_ds, "--data-source-path")(args, self.tokenizer)
        elif args.prompt_data:
            self.data_source = RolloutDataSource(args, self.tokenizer)

    # ------------------------------------------------------------------ running a hook in a loop
    def _progress(self, total: int, desc: str):
        off = (self.args.disable_tqdm or os.environ.get("SLIME_LIKE_NO_TQDM") == "1"
               or not sys.stderr.isatty())
        if off:
            return None
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="sample", dynamic_ncols=True)

    async def _run(self, fn, rollout_id: int, evaluation: bool, progress):
        if self._pool is None:
            self._pool = await EnginePool(
                self.engine_urls, dead=self.dead_engines, timeout=request_timeout(self.args),
                api_key=self.args.engine_api_key,
                health_interval=self.args.rollout_health_check_interval,
                health_timeout=self.args.rollout_health_check_timeout,
                health_first_wait=self.args.rollout_health_check_first_wait,
                allow_empty=self.args.debug_train_only, router=self.router_url).__aenter__()
        pool = self._pool
        pool.tokens_generated = 0  # this rollout's counts
        pool.answered = dict.fromkeys(pool.targets, 0)
        state = GenerateState(self.args, pool, self.tokenizer, progress)
        set_current_state(state)
        pool.start_watchdog()   # a hung engine is found while this rollout waits on it
        try:
            out = fn(self.args, rollout_id, self.data_source, evaluation=evaluation)
            if inspect.isawaitable(out):
                out = await out
        finally:
            await pool.stop_watchdog()
        return out, pool.tokens_generated

    def _call(self, fn, rollout_id: int, evaluation: bool, total: int, desc: str):
        progress = self._progress(total, desc)
        box = []

        async def main():
            # The result leaves through `box`, not as the main task's result: asyncio.run's SIGINT bookkeeping
            # formats repr(main task) (result included) twice per call, i.e. every sample of the rollout.
            box.append(await self._run(fn, rollout_id, evaluation, progress))

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(main())
            return box[0]
        finally:
            self._cancel_leftover_tasks()  # what asyncio.run did at its end: nothing runs on between rollouts
            if progress is not None:
                progress.close()

    def on_engines(self, urls: list[str], request) -> list:
        """`await request(client)` for each of `urls`, in the run's event loop over connections kept for the run:
        the rollout pool's client of an engine it serves, else a client on one run-wide session (engines behind
        a router, or before the first rollout). Memory release / resume and the weight checks go through here."""
        async def main():
            return await asyncio.gather(*(request(self._client_for(u)) for u in urls))

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(main())

    def _client_for(self, url: str):
        if self._pool is not None and url in self._pool.clients:
            return self._pool.clients[url]
        import aiohttp

        from slime_like.backends.engine_api.client import EngineClient

        if self._side_session is None:
            self._side_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return EngineClient(url, session=self._side_session, api_key=self.args.engine_api_key)

    def _cancel_leftover_tasks(self):
        tasks = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def close(self):
        """Close the engine connections and the event loop (the end of the run); stop a fully async worker."""
        fully_async.stop_worker()
        if self._loop is None:
            return
        if self._pool is not None:
            self._loop.run_until_complete(self._pool.__aexit__(None, None, None))
            self._pool = None
        if self._side_session is not None:
            self._loop.run_until_complete(self._side_session.close())
            self._side_session = None
        self._loop.close()
        self._loop = None

    # ------------------------------------------------------------------ public API
    def generate(self, rollout_id: int):
        """(samples of the kept groups, flattened, metrics dict)."""
        if self.debug_load:
            samples = load_rollout(self.debug_load, rollout_id,
                                   self.args.load_debug_rollout_data_subsample)
            return samples, rollout_metrics(self.args, samples, 0.0, 0)
        if self.data_source is None:
            raise ValueError("--prompt-data is required to generate rollouts")
        total = int(self.args.rollout_batch_size) * int(self.args.n_samples_per_prompt)
        t0 = time.perf_counter()
        out, tokens = self._call(self.rollout_fn, rollout_id, False, total, f"rollout {rollout_id}")
        out = as_rollout_output(out)
        elapsed = time.perf_counter() - t0
        groups = out.groups if isinstance(out, RolloutOutput) else out
        # Completion order depends on timing; prompt order makes runs reproducible.
        samples = [s for g in sorted(groups, key=lambda g: g[0].group_index) for s in g]
        metrics = rollout_metrics(self.args, samples, elapsed, tokens)
        if isinstance(out, RolloutOutput):
            metrics.update(out.metrics)
        if self.dead_engines:
            metrics["rollout/dead_engines"] = len(self.dead_engines)
        if self._pool is not None and any(self._pool.answered.values()):
            # how many engines served this rollout (behind a router only it knows), how many are live at its end
            # (not in fully async mode, where the worker's own pool generates)
            if not self._pool.router:
                metrics["rollout/engines_answering"] = sum(n > 0 for n in self._pool.answered.values())
            metrics["rollout/engines_live"] = len(self._pool.alive)
        metrics.update(category_metrics(self.args, samples))
        if self.args.log_passrate:
            metrics.update(passrate_metrics(self.args, groups))
        if self.args.log_multi_turn:
            metrics.update(multi_turn_metrics(self.args, samples))
        if self.args.log_correct_samples:
            metrics.update(correct_sample_metrics(self.args, samples))
        if self.args.save_debug_rollout_data:
            save_rollout(self.args.save_debug_rollout_data, rollout_id, samples)
        return samples, self._custom_log("custom_rollout_log_function_path", metrics,
                                         rollout_id, self.args, samples, metrics, elapsed)

    def evaluate(self, rollout_id: int) -> dict:
        datasets = eval_datasets(self.args)
        if not datasets:
            return {}
        out = as_rollout_output(self._call(self.eval_fn, rollout_id, True, 0, f"eval {rollout_id}")[0])
        metrics = {}
        for name, groups in out.items():
            metrics.update(eval_metrics(self.args, name, groups))
        return self._custom_log("custom_eval_rollout_log_function_path", metrics, rollout_id, self.args, out, metrics)

    def _custom_log(self, flag: str, metrics: dict, *hook_args) -> dict:
        """slime's logging hooks: ``f(rollout_id, args, samples_or_eval_data, metrics[, rollout_time])``;
        a truthy return means the hook logged everything itself, so no metrics are returned to log."""
        path = getattr(self.args, flag, None)
        if not path:
            return metrics
        handled = load_function(path, "--" + flag.replace("_", "-"))(*hook_args)
        return {} if handled else metrics

    def probe_engines(self) -> dict[str, str]:
        """Health-check every live engine now (--use-fault-tolerance, before a weight push: an engine that died
        while the trainer trained is found here, not by the push) -> {URL: error} of the dead ones."""
        if self._pool is not None:
            self._loop.run_until_complete(self._pool.probe())
        return dict(self.dead_engines)

    def replace_engines(self, replaced: dict[str, str]) -> None:
        """{dead URL: URL of its restarted engine} (--use-fault-tolerance; the Ray layer restarted it and pushed
        the current weights to it first): the next requests may go there."""
        self.engine_urls = [replaced.get(u, u) for u in self.engine_urls]
        for old, new in replaced.items():
            if self._pool is not None:
                self._loop.run_until_complete(self._pool.replace_engine(old, new))
            self.dead_engines.pop(old, None)

    def state_dict(self) -> dict:
        ds = self.data_source
        if fully_async.active_worker() is not None:   # its running / buffered prompts go back into the buffer
            return {"data_source": fully_async.checkpoint_state(ds)}
        return {"data_source": ds.state_dict() if ds is not None and hasattr(ds, "state_dict") else None}

    def load_state_dict(self, state: dict) -> None:
        if state.get("data_source") is not None and self.data_source is not None:
            self.data_source.load_state_dict(state["data_source"])

"""remote_rm against a real local aiohttp server: transient failures are retried, a dead one fails clearly."""
import asyncio
import socket

import pytest
from aiohttp import web

from slime_like.args import make_args
from slime_like.rollout.rewards import RemoteRewardError, assign_rewards
from slime_like.sample import Sample


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _run_with_flaky_server(fail_times: int, samples):
    calls = []

    async def handler(request):
        body = await request.json()
        calls.append(body)
        if len(calls) <= fail_times:
            return web.Response(status=503, text="warming up")
        return web.json_response(1.0 if body["response"] == body["label"] else 0.0)

    app = web.Application()
    app.router.add_post("/reward", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        args = make_args(rm_type="remote_rm", rm_url=f"http://127.0.0.1:{port}/reward", custom_rm_path=None,
                         rm_max_retries=4, rm_retry_backoff=0.01, rm_timeout=5, rollout_batch_size=1)
        await assign_rewards(args, samples)
    finally:
        await runner.cleanup()
    return calls


def test_remote_rm_retries_then_answers():
    samples = [Sample(index=0, prompt="p", response="42", label="42")]
    calls = asyncio.run(_run_with_flaky_server(2, samples))
    assert len(calls) == 3                       # two 503s, then the answer
    assert calls[-1] == {"prompt": "p", "response": "42", "label": "42", "metadata": {}}
    assert samples[0].reward == 1.0


def test_remote_rm_down_fails_with_url():
    port = _free_port()                          # nothing listens here
    args = make_args(rm_type="remote_rm", rm_url=f"http://127.0.0.1:{port}/reward", custom_rm_path=None,
                     rm_max_retries=3, rm_retry_backoff=0.01, rm_timeout=2, rollout_batch_size=1)
    with pytest.raises(RemoteRewardError, match=rf"127.0.0.1:{port}/reward failed 3 attempts"):
        asyncio.run(assign_rewards(args, [Sample(index=5, group_index=2, response="x", label="y")]))


async def _serve(handler):
    app = web.Application()
    app.router.add_post("/reward", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}/reward"


def _args(url, **kw):
    return make_args(rm_type="remote_rm", rm_url=url, custom_rm_path=None, rm_retry_backoff=0.002, rm_timeout=5,
                     rollout_batch_size=8, n_samples_per_prompt=8, **kw)


def test_a_server_failing_30_percent_completes_every_rollout_with_few_warning_lines(caplog):
    """Issue 19, finding 9: 10 rollouts of 64 samples against a server answering 500 to 30 % of requests."""
    import random

    rng = random.Random(0)

    async def flaky(request):
        body = await request.json()
        if rng.random() < 0.3:
            return web.Response(status=500, text="overloaded")
        return web.json_response(float(body["response"] == body["label"]))

    async def rollout(url):
        samples = [Sample(index=i, group_index=i // 8, response="a", label="a") for i in range(64)]
        await asyncio.gather(*(assign_rewards(_args(url), samples[g:g + 8]) for g in range(0, 64, 8)))
        return samples

    async def one_rollout():   # the controller runs each rollout in its own event loop (asyncio.run)
        runner, url = await _serve(flaky)
        try:
            return await rollout(url)
        finally:
            await runner.cleanup()

    with caplog.at_level("WARNING", logger="slime_like.rollout.rewards.remote"):
        rollouts = [asyncio.run(one_rollout()) for _ in range(10)]
    assert all(s.reward == 1.0 for samples in rollouts for s in samples)
    # one line per rollout (and per 10 s of a slow one), not one per retry (~270 here); only this logger's lines
    # count (the garbage collector may report another test's unclosed session on asyncio's logger meanwhile)
    lines = [r for r in caplog.records if r.name == "slime_like.rollout.rewards.remote"]
    assert 0 < len(lines) <= 20, len(lines)


def test_a_dead_server_opens_the_circuit_quickly():
    import time

    async def dead(request):
        return web.Response(status=500, text="down")

    async def main():
        runner, url = await _serve(dead)
        try:
            samples = [Sample(index=i, group_index=i, response="a", label="a") for i in range(32)]
            await asyncio.gather(*(assign_rewards(_args(url, rm_circuit_breaker=10), [s]) for s in samples))
        finally:
            await runner.cleanup()

    t = time.perf_counter()
    with pytest.raises(RemoteRewardError, match="10 failures in a row"):
        asyncio.run(main())
    assert time.perf_counter() - t < 10

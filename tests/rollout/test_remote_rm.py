"""remote_rm against a real local aiohttp server: transient failures are retried, a dead one fails clearly."""
import asyncio
import socket
from argparse import Namespace

import pytest
from aiohttp import web

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
        args = Namespace(rm_type="remote_rm", rm_url=f"http://127.0.0.1:{port}/reward", custom_rm_path=None,
                         rm_max_retries=4, rm_retry_backoff=0.01, rm_timeout=5)
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
    args = Namespace(rm_type="remote_rm", rm_url=f"http://127.0.0.1:{port}/reward", custom_rm_path=None,
                     rm_max_retries=3, rm_retry_backoff=0.01, rm_timeout=2)
    with pytest.raises(RemoteRewardError, match=rf"127.0.0.1:{port}/reward failed 3 attempts"):
        asyncio.run(assign_rewards(args, [Sample(index=5, group_index=2, response="x", label="y")]))

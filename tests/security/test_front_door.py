"""Issue 19, finding 11: the CPU engine's front door. A real engine process on 127.0.0.1: every malformed body
of the probe answers 400 with a message (none 500, none 200); a 5 MB `text` is refused at once while /health
keeps answering; a client that disconnects has its requests aborted."""
import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from slime_like.args import make_args
from slime_like.backends.engine_api.launcher import start_engine
from slime_like.utils.auth import auth_headers

pytestmark = pytest.mark.slow

BAD_BODIES = [
    ("deep nesting", "[" * 100000 + "]" * 100000),
    ("input_ids as a dict", {"input_ids": {"a": 1}}),
    ("text as an int", {"text": 5}),
    ("sampling_params as a string", {"input_ids": [1, 2], "sampling_params": "greedy"}),
    ("temperature a word", {"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}}),
    ("stop an int", {"input_ids": [1, 2], "sampling_params": {"stop": 5}}),
    ("temperature NaN", '{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}'),
    ("temperature Infinity", '{"input_ids": [1, 2], "sampling_params": {"temperature": Infinity}}'),
    ("max_new_tokens 2.5", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2.5}}),
    ("input_ids booleans", {"input_ids": [True, False]}),
    ("top_k 10**12", {"input_ids": [1, 2], "sampling_params": {"top_k": 10 ** 12}}),
    ("rid a dict", {"input_ids": [1, 2], "rid": {"x": 1}}),
    ("return_logprob a string", {"input_ids": [1, 2], "return_logprob": "yes"}),
    ("empty input_ids", {"input_ids": []}),
    ("nested input_ids", {"input_ids": [[[1]]]}),
    ("stop_token_ids strings", {"input_ids": [1, 2], "sampling_params": {"stop_token_ids": ["a"]}}),
    ("ignore_eos a number", {"input_ids": [1, 2], "sampling_params": {"ignore_eos": 1}}),
    ("body a list", [1, 2, 3]),
    # values float32 cannot hold (issue 31 item 5: repetition_penalty 1e-45 is 0 there and gave NaN log-probs)
    ("repetition_penalty 1e-45", {"input_ids": [1, 2], "sampling_params": {"repetition_penalty": 1e-45}}),
    ("temperature 1e39", {"input_ids": [1, 2], "sampling_params": {"temperature": 1e39}}),
    ("top_p 1e-40", {"input_ids": [1, 2], "sampling_params": {"top_p": 1e-40}}),
]


@pytest.fixture(scope="module")
def engine_proc(tiny_ckpt, tmp_path_factory):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = make_args(hf_checkpoint=tiny_ckpt, seed=0, save=None, sglang_server_args={})
    proc = start_engine(args, kind="cpu", port=port, log_dir=str(tmp_path_factory.mktemp("logs")),
                        env={"OMP_NUM_THREADS": "1"})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def engine(engine_proc):
    return engine_proc.url


def _post(url, path, body, timeout=60):
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    req = urllib.request.Request(url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **auth_headers()})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _get(url, path, timeout=30):
    req = urllib.request.Request(url + path, headers=auth_headers())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


@pytest.mark.parametrize("name,body", BAD_BODIES, ids=[n for n, _ in BAD_BODIES])
def test_malformed_bodies_get_400_with_a_message(engine, name, body):
    status, text = _post(engine, "/generate", body)
    assert status == 400, (name, status, text[:300])
    assert json.loads(text)["error"]["message"]


def test_huge_text_is_refused_without_blocking_health(engine):
    answers = []

    def health_probe():
        t = time.perf_counter()
        answers.append((_get(engine, "/health")[0], time.perf_counter() - t))

    t0 = time.perf_counter()
    probe = threading.Timer(0.05, health_probe)
    probe.start()
    status, text = _post(engine, "/generate", {"text": "a" * (5 << 20)})
    probe.join()
    assert status == 400 and "--max-text-chars" in text
    assert time.perf_counter() - t0 < 5.0
    assert answers and answers[0][0] == 200 and answers[0][1] < 2.0, answers
    assert _post(engine, "/generate", {"text": "abc", "sampling_params": {"max_new_tokens": 2}})[0] == 200


def test_client_that_disconnects_has_its_requests_aborted(engine):
    import aiohttp

    def generated():
        return json.loads(_get(engine, "/get_server_info")[1])["internal_states"][0]["generated_tokens"]

    body = {"input_ids": [[2, 3, 4]] * 64, "sampling_params": {"max_new_tokens": 250, "ignore_eos": True,
                                                                "temperature": 1.0}}

    async def go_away_once_decoding():
        # leave as soon as the engine has decoded something: a fixed client timeout raced the engine (on a
        # quiet machine all 64 x 250 tokens were done within the 1 s the client waited)
        async with aiohttp.ClientSession(headers=auth_headers()) as s:
            request = asyncio.ensure_future(s.post(engine + "/generate", json=body))
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline and not request.done():
                async with s.get(engine + "/get_server_info") as r:
                    if (await r.json())["internal_states"][0]["generated_tokens"] > before:
                        break
                await asyncio.sleep(0.005)
            assert not request.done(), "the request finished before the client could leave"
            request.cancel()  # closes the connection mid-request
            try:
                await request
            except asyncio.CancelledError:
                pass

    before = generated()
    asyncio.run(go_away_once_decoding())
    time.sleep(1.5)
    settled = generated()
    time.sleep(1.5)
    assert generated() == settled, "the engine kept decoding for a client that left"
    assert before < settled and settled - before < 64 * 250, (before, settled)


def test_a_sigstopped_engine_is_detected_within_the_health_timeout(engine_proc):
    """Issue 19, finding 10 (runs last: it stops the module's engine). One engine, SIGSTOPped mid-request: the
    watchdog marks it dead within --rollout-health-check-timeout and the rollout fails naming it, not hanging."""
    import os
    import signal

    from slime_like.rollout.engines import EnginePool, NoEngineLeft

    body = {"max_new_tokens": 250, "ignore_eos": True, "temperature": 1.0}

    async def rollout():
        async with EnginePool([engine_proc.url], timeout=600, health_interval=0.5, health_timeout=2.0) as pool:
            pool.start_watchdog()
            loop = asyncio.get_running_loop()
            loop.call_later(0.2, os.kill, engine_proc.popen.pid, signal.SIGSTOP)
            return await pool.generate([[2, 3, 4]] * 128, body)   # seconds of decoding: stopped mid-request

    t = time.perf_counter()
    try:
        with pytest.raises(NoEngineLeft, match=r"no answer to /health within 2s"):
            asyncio.run(rollout())
        assert time.perf_counter() - t < 15, time.perf_counter() - t
    finally:
        os.kill(engine_proc.popen.pid, signal.SIGCONT)

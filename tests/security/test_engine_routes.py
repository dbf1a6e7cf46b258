"""Issue 31 item 8, the engine's side, each probe against a real CPU engine process:
- six /init_weights_update_group calls naming a master nobody serves: one rendezvous at a time on a thread of its
  own (the rest answer 409 at once), /health and /generate keep answering, the rendezvous ends in a 504;
- /update_weights_from_disk takes model_path literally (a glob pattern matched every checkpoint beside the model)
  and only inside the engine's weight directories;
- a field of the wrong JSON type is a 400 on every route, never a 500;
- an engine without a key refuses to start off loopback and warns on loopback.
"""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from slime_like.utils.net import free_port

pytestmark = pytest.mark.slow
KEY = os.environ.get("SLIME_LIKE_ENGINE_API_KEY", "test-suite-engine-key")


def _post(url, path, body, key=KEY, timeout=300):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def engine(tiny_ckpt, tmp_path_factory):
    from slime_like.args import make_args
    from slime_like.backends.engine_api.launcher import start_engine

    proc = start_engine(make_args(hf_checkpoint=tiny_ckpt, seed=0), kind="cpu", port=free_port(),
                        log_dir=str(tmp_path_factory.mktemp("logs")), env={"OMP_NUM_THREADS": "1"}, api_key=KEY)
    yield proc
    proc.stop()


def test_rendezvous_with_an_unreachable_master_leaves_generation_running(engine):
    body = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2,
            "backend": "gloo"}
    results = {}

    def call(i):
        results[i] = _post(engine.url, "/init_weights_update_group", dict(body, group_name=f"g{i}"))

    # all six at once: whichever the engine takes first waits in the rendezvous, the other five answer 409 at once
    # (starting one first and the rest later raced: a later one could be taken first)
    threads = {i: threading.Thread(target=call, args=(i,)) for i in range(6)}
    for t in threads.values():
        t.start()
    deadline = time.monotonic() + 50   # well inside the 60 s rendezvous timeout
    while len(results) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting = [i for i, t in threads.items() if t.is_alive()]
    assert len(waiting) == 1 and len(results) == 5, results
    assert all(code == 409 and "another weight-update group" in text for code, text in results.values()), results
    status, text = _post(engine.url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})
    assert status == 200, text
    assert urllib.request.urlopen(engine.url + "/health", timeout=30).status == 200
    (w,) = waiting
    assert threads[w].is_alive()   # generation and health were served while the rendezvous was still waiting
    threads[w].join()
    assert results[w][0] == 504 and "failed within 60 s" in results[w][1], results[w]


def test_model_path_is_literal_and_inside_the_weight_dirs(engine, tiny_ckpt, tmp_path):
    pattern = os.path.join(os.path.dirname(tiny_ckpt), "*")
    status, text = _post(engine.url, "/update_weights_from_disk", {"model_path": pattern})
    assert status == 400 and "no such directory" in text and "wildcards are not expanded" in text, text
    outside = tmp_path.parent.parent / "elsewhere"
    outside.mkdir(exist_ok=True)
    status, text = _post(engine.url, "/update_weights_from_disk", {"model_path": str(outside)})
    assert status == 400 and "outside the directories this engine loads weights from" in text, text
    status, text = _post(engine.url, "/update_weights_from_disk", {"model_path": tiny_ckpt})
    assert status == 200, text


WRONG = {
    "/init_weights_update_group": {"master_address": "127.0.0.1", "master_port": "abc", "rank_offset": 1,
                                   "world_size": 2, "backend": "gloo"},
    "/update_weights_from_distributed": {"names": ["a"], "dtypes": ["float32"], "shapes": "3x3"},
    "/destroy_weights_update_group": {"group_name": ["x"]},
    "/update_weights_from_disk": {"model_path": 5},
    "/update_weights_from_tensor": {"serialized_named_tensors": [7]},
    "/weights_checker": {"action": 3},
    "/abort_request": {"rid": {"a": 1}},
    "/release_memory_occupation": {"tags": 5},
    "/pause_generation": {"mode": ["abort"]},
}


def test_wrong_types_are_400_not_500(engine):
    for path, body in WRONG.items():
        status, text = _post(engine.url, path, body)
        assert status == 400, (path, status, text)
    big = {"names": ["a"], "dtypes": ["float32"], "shapes": [[10 ** 6, 10 ** 6]]}
    status, text = _post(engine.url, "/update_weights_from_distributed", dict(big, group_name="none"))
    assert status == 400, text


def _engine_argv(tiny_ckpt, host):
    return [sys.executable, "-m", "slime_like.backends.cpu_engine", "--model-path", tiny_ckpt, "--host", host,
            "--port", str(free_port())]


def test_an_engine_without_a_key_refuses_to_listen_off_loopback(tiny_ckpt):
    env = {k: v for k, v in os.environ.items() if k != "SLIME_LIKE_ENGINE_API_KEY"}
    out = subprocess.run(_engine_argv(tiny_ckpt, "0.0.0.0"), env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--host 0.0.0.0: an engine listening off loopback needs an API key" in out.stderr


def test_an_engine_without_a_key_warns_on_loopback(tiny_ckpt, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLIME_LIKE_ENGINE_API_KEY"}
    log = tmp_path / "engine.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(_engine_argv(tiny_ckpt, "127.0.0.1"), env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        import time

        for _ in range(600):
            if "no API key" in log.read_text() or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert "no API key (SLIME_LIKE_ENGINE_API_KEY / --api-key): every route on 127.0.0.1" in log.read_text()
    finally:
        proc.kill()
        proc.wait()

"""Issue 19, findings 1 and 2: nobody reaches into an engine.

A real CPU engine process on 127.0.0.1: with a key, every route (each one the server registers) but GET /health
answers 401 without the key or with a wrong one; a crafted pickle sent to the tensor route with the right key does not
run (400); without a key the tensor route is refused outright. The Ray engine actor binds loopback on one node.
"""
import base64
import os
import pickle
import urllib.error
import urllib.request

import psutil
import pytest

from slime_like.args import make_args
from slime_like.backends.cpu_engine.server import routes

pytestmark = pytest.mark.slow

KEY = "sec-test-key-1"


def _call(url, method, path, body=b"{}", key=None):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, data=body if method == "POST" else None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


@pytest.fixture(scope="module")
def keyed_engine(tiny_ckpt, tmp_path_factory):
    """One engine started the way a run starts it: a Ray engine actor on a one-node cluster."""

    import ray

    from slime_like.ray.cluster import init_ray
    from slime_like.ray.placement import create_placement
    from slime_like.ray.rollout_manager import EngineGroup

    init_ray(make_args(num_gpus_per_node=1))
    placement = create_placement(1)
    args = make_args(hf_checkpoint=tiny_ckpt, seed=0, save=str(tmp_path_factory.mktemp("run")),
                              sglang_server_args={"max_running_requests": 4}, engine_api_key=KEY,
                              sglang_router_ip=None, sglang_router_port=None)
    group = EngineGroup.start(args, placement, [[0]], 1.0, kind="cpu")
    try:
        yield group.urls[0]
    finally:
        group.stop()
        placement.remove()
        ray.shutdown()


def test_engine_of_a_one_node_run_listens_on_loopback_only(keyed_engine):
    port = int(keyed_engine.rsplit(":", 1)[1])
    assert keyed_engine.startswith("http://127.0.0.1:")
    listening = [c.laddr for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                 and c.laddr.port == port]
    assert listening and all(a.ip == "127.0.0.1" for a in listening), listening


def test_every_route_refuses_callers_without_the_key(keyed_engine):
    seen = set()
    for route in routes:
        methods = ["GET", "POST"] if route.method == "*" else [route.method]
        for method in methods:
            if (method, route.path) == ("GET", "/health"):   # open, as in SGLang: an empty 200 (sglang-router
                assert _call(keyed_engine, method, route.path)[0] == 200   # checks it without a key)
                continue
            for key in (None, "wrong-key", KEY[:-1]):
                status, _ = _call(keyed_engine, method, route.path, key=key)
                assert status == 401, (method, route.path, key, status)
            seen.add(route.path)
    assert {"/update_weights_from_disk", "/update_weights_from_tensor", "/init_weights_update_group",
            "/release_memory_occupation", "/pause_generation", "/abort_request", "/generate",
            "/health_generate"} <= seen
    assert _call(keyed_engine, "GET", "/health", key=KEY)[0] == 200


def test_pickle_payload_does_not_run(keyed_engine, tmp_path):
    marker = str(tmp_path / "code_ran")
    blob = base64.b64encode(pickle.dumps([("w", _Payload(marker))])).decode()
    import json

    body = json.dumps({"serialized_named_tensors": [blob]}).encode()
    status, text = _call(keyed_engine, "POST", "/update_weights_from_tensor", body, key=KEY)
    assert status == 400 and "refusing posix.makedirs" in text.replace("os.makedirs", "posix.makedirs"), text
    assert not os.path.exists(marker)
    assert _call(keyed_engine, "GET", "/health", key=KEY)[0] == 200


def test_engine_without_a_key_refuses_the_tensor_route(tmp_path):
    """The route answers 403 before it looks at the body or the engine, so a bare app serves the check."""
    import asyncio
    import json
    import types

    from aiohttp import ClientSession, web

    from slime_like.backends.cpu_engine.server import build_app

    marker = str(tmp_path / "code_ran")
    blob = base64.b64encode(pickle.dumps([("w", _Payload(marker))])).decode()

    async def main():
        runner = web.AppRunner(build_app(types.SimpleNamespace(shutdown=lambda: None), api_key=None))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with ClientSession() as s, s.post(f"http://127.0.0.1:{port}/update_weights_from_tensor",
                                                   json={"serialized_named_tensors": [blob]}) as r:
                return r.status, await r.text()
        finally:
            await runner.cleanup()

    status, text = asyncio.run(main())
    assert status == 403 and "API key" in json.loads(text)["error"]["message"]
    assert not os.path.exists(marker)

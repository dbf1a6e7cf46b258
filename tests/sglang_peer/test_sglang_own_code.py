"""Our SGLang side checked by SGLang's own code (0.5.23 on CPU): generated flags, launch command, request bodies."""
import argparse
import asyncio
import json
import subprocess
import sys
import threading

import pytest
import torch
from aiohttp import web

from conftest import run_check


def test_every_generated_sglang_flag_round_trips_through_sglangs_parser(checked):
    """--sglang-X V -> our parser (generated from the real ServerArgs) -> build_sglang_command -> SGLang's own
    parser reads what it reads from --X V. 532 options; the few with JSON / custom value parsers are not probed."""
    r = checked["passthrough"]
    assert r["options"] > 500 and r["checked"] > 450, r
    assert r["failed"] == [], r["failed"]


def test_launch_command_gives_the_intended_server_args(checked):
    r = checked["launch"]
    assert r["argv"][:2] == ["-m", "sglang.launch_server"]
    assert r["mismatch"] == {}, r["mismatch"]


JOIN = """
import json, sys, torch
from slime_like.backends.engine_api.process_group import init_custom_process_group
b, shapes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pg = init_custom_process_group(b["backend"], "tcp://%s:%d" % (b["master_address"], b["master_port"]),
                               b["world_size"], b["rank_offset"], b["group_name"])
for shape in shapes:
    torch.distributed.broadcast(torch.empty(shape), src=0, group=pg)
"""


class Recorder:
    """A loopback server that records every JSON body sent to it and plays the engine's side of the weight-sync
    process group (joins as rank 1 and receives the broadcasts), so the real senders run to completion."""

    def __init__(self, shapes):
        self.bodies, self.shapes, self.joiner = [], shapes, None
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self):
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = "http://127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]

    async def handle(self, request):
        body = await request.json() if request.can_read_body else {}
        self.bodies.append((request.path, body))
        if request.path == "/init_weights_update_group":   # the engine's side, in its own process (as in life)
            self.joiner = subprocess.Popen([sys.executable, "-c", JOIN, json.dumps(body), json.dumps(self.shapes)])
        answer = [{"text": "", "output_ids": [], "meta_info": {}}] * len(body["input_ids"]) \
            if request.path == "/generate" and isinstance(body["input_ids"][0], list) else {"success": True}
        return web.json_response(answer)


@pytest.fixture(scope="module")
def checked(sglang_python, tmp_path_factory):
    """Record every body our client and senders send, then run all three checks in one SGLang interpreter."""
    path = record_bodies(tmp_path_factory.mktemp("sglang_bodies"))
    return run_check(sglang_python, "all", str(path))


def record_bodies(tmp_path):
    from slime_like.backends.engine_api import weight_sync
    from slime_like.backends.engine_api.client import EngineClient
    from slime_like.rollout.generate import sampling_params_from_args

    named = [("model.embed_tokens.weight", torch.randn(8, 4)), ("lm_head.weight", torch.randn(8, 4))]
    rec = Recorder([list(t.shape) for _, t in named])
    # the rollout's own sampling parameters, with every optional one set
    sp = sampling_params_from_args(argparse.Namespace(
        rollout_temperature=0.8, rollout_top_p=0.9, rollout_top_k=20, rollout_max_response_len=8,
        rollout_stop=["</s>"], rollout_stop_token_ids=[1, 2], rollout_min_new_tokens=1,
        rollout_skip_special_tokens=False, rollout_repetition_penalty=1.1))

    async def drive():
        c = EngineClient(rec.url)
        await c.generate([5, 6, 7], sp, return_logprob=True, rid="s1")
        await c.generate([[5, 6], [7, 8, 9]], [sp, sp], return_logprob=True, rid=["a", "b"])
        await c.abort("s1")
        await c.abort()
        await c.pause_generation("abort")
        await c.continue_generation()
        await c.release_memory(["weights", "kv_cache"])
        await c.resume_memory(["weights"])
        await c.release_memory()
        await c.resume_memory()
        await c.update_weights_from_disk(str(tmp_path))
    asyncio.run(drive())
    sender = weight_sync.TensorWeightSender([rec.url])
    sender.send(named)
    sender.close()
    dist = weight_sync.DistributedWeightSender([rec.url], backend="gloo")
    dist.connect()
    dist.send(named, bucket_bytes=100)
    dist.close()
    rec.joiner.wait(60)
    path = tmp_path / "bodies.json"
    path.write_text(json.dumps(rec.bodies))
    return path


def test_every_request_body_we_send_is_accepted_by_sglangs_request_classes(checked):
    r = checked["bodies"]
    assert r["rejected"] == [], r["rejected"]
    for route in ("/generate", "/abort_request", "/pause_generation", "/continue_generation",
                  "/release_memory_occupation", "/resume_memory_occupation", "/update_weights_from_disk",
                  "/update_weights_from_tensor", "/init_weights_update_group", "/update_weights_from_distributed",
                  "/destroy_weights_update_group"):
        assert r["accepted"].get(route), (route, r)

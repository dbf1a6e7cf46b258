"""Our SGLang side checked by SGLang's own code (0.5.23 on CPU): generated flags, launch command, request bodies,
our CPU engine's /generate answers against the ones SGLang's TokenizerManager builds, and the router's command
line through sglang_router's own parser (0.3.2, the router SGLang 0.5.23's own test fixtures launch)."""
import asyncio
import json
import os
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


def test_an_engine_over_two_nodes_is_one_tp_group_of_sglang(checked):
    """One engine of 16 GPUs over two 8-GPU nodes: each node's command is read by SGLang as TP 16, --nnodes 2, its
    own --node-rank, node 0's --dist-init-addr; all 16 ranks take the weight push."""
    r = checked["nodes"]
    assert len(r["argv"]) == 2 and r["mismatch"] == [], r["mismatch"]
    assert r["weight_sync_ranks"] == 16


def test_prefill_and_decode_engines_and_their_router_as_sglang_reads_them(checked):
    """--prefill-num-servers 1 over three engines: engine 0 is read by SGLang as a prefill server with its bootstrap
    port, engines 1-2 as decode servers (the transfer backend passed through); the router command is read by
    sglang_router as --pd-disaggregation with the prefill URL + bootstrap port and both decode URLs."""
    r = checked["disaggregation"]
    assert len(r["argv"]) == 3 and r["mismatch"] == [], r["mismatch"]
    router = r["router"]
    if "not_installed" in router and os.environ.get("CI", "").lower() != "true":
        pytest.skip("sglang-router not installed in the SGLang environment: run bench/vllm_peer/setup_env.sh")
    assert router["pd_disaggregation"] is True and router["worker_urls"] == []
    assert router["prefill_urls"] == [["http://10.0.0.5:30001", 9000]]
    assert router["decode_urls"] == ["http://10.0.0.5:30002", "http://10.0.0.5:30003"]


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
    """Record every body our client and senders send and our CPU engine's answers, then run every check in one
    SGLang interpreter."""
    path = record_bodies(tmp_path_factory.mktemp("sglang_bodies"))
    answers, ckpt = record_cpu_engine_answers(tmp_path_factory.mktemp("sglang_answers"))
    return run_check(sglang_python, "all", str(path), str(answers), ckpt)


def record_cpu_engine_answers(tmp_path):
    """[name, request, answer] of our CPU engine for each answer shape: length / stop token / stop string / abort
    finish, with and without log-probs, a batch's items."""
    from slime_like.args import make_args
    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.backends.engine_api.client import EngineClient
    from slime_like.tools.tiny_model import build_tiny_checkpoint
    from slime_like.utils.net import free_port

    ckpt = build_tiny_checkpoint(str(tmp_path / "ckpt"))
    args = make_args(hf_checkpoint=ckpt, seed=0)
    engine = start_engine(args, kind="cpu", port=free_port(), log_dir=str(tmp_path), env={"OMP_NUM_THREADS": "1"})
    greedy = {"temperature": 0.0, "max_new_tokens": 8}
    cases = []

    async def ask(c, name, ids, sp, **kw):
        kw.setdefault("return_logprob", True)   # the client's default, recorded as sent
        out = await c.generate(ids, sp, **kw)
        cases.append([name, {"input_ids": ids, "sampling_params": sp, **kw}, out])
        return out

    async def drive():
        c = EngineClient(engine.url)
        first = await ask(c, "length, log-probs", [5, 6, 7], greedy, return_logprob=True, rid="s1")
        await ask(c, "no log-probs, no rid", [5, 6, 7], greedy, return_logprob=False)
        await ask(c, "stop token", [5, 6, 7], {**greedy, "stop_token_ids": [first["output_ids"][2]]}, return_logprob=True)
        stop = next((ch for ch in first["text"][1:] if ch.strip()), None)
        if stop:
            await ask(c, "stop string", [5, 6, 7], {**greedy, "stop": [stop]}, return_logprob=True)
        batch_sp = [greedy, {**greedy, "max_new_tokens": 3}]
        batch = await c.generate([[5, 6], [7, 8, 9]], batch_sp, return_logprob=True, rid=["b0", "b1"])
        for i, ids in enumerate([[5, 6], [7, 8, 9]]):
            cases.append([f"batch item {i}", {"input_ids": ids, "sampling_params": batch_sp[i], "return_logprob": True,
                                              "rid": f"b{i}"}, batch[i]])
        async def generated():
            return (await c.get_server_info())["internal_states"][0]["generated_tokens"]

        before = await generated()
        long = asyncio.ensure_future(ask(c, "abort", [5, 6], {"max_new_tokens": 240, "ignore_eos": True},
                                         return_logprob=True, rid="long"))
        while await generated() <= before and not long.done():   # abort once it is decoding
            await asyncio.sleep(0.005)
        await c.abort("long")
        await long
    try:
        asyncio.run(drive())
    finally:
        engine.stop()
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(cases))
    return path, ckpt


def record_bodies(tmp_path):
    from slime_like.backends.engine_api import weight_sync
    from slime_like.backends.engine_api.client import EngineClient
    from slime_like.args import make_args
    from PIL import Image

    from slime_like.multimodal.images import image_to_data_url
    from slime_like.rollout.generate import sampling_params_from_args

    named = [("model.embed_tokens.weight", torch.randn(8, 4)), ("lm_head.weight", torch.randn(8, 4))]
    rec = Recorder([list(t.shape) for _, t in named])
    # the rollout's own sampling parameters, with every optional one set
    sp = sampling_params_from_args(make_args(
        rollout_temperature=0.8, rollout_top_p=0.9, rollout_top_k=20, rollout_max_response_len=8,
        rollout_stop=["</s>"], rollout_stop_token_ids=[1, 2], rollout_min_new_tokens=1,
        rollout_skip_special_tokens=False, rollout_repetition_penalty=1.1))

    async def drive():
        c = EngineClient(rec.url)
        await c.generate([5, 6, 7], sp, return_logprob=True, rid="s1")
        await c.generate([[5, 6], [7, 8, 9]], [sp, sp], return_logprob=True, rid=["a", "b"])
        # a vision-language rollout's requests: image_data as the rollout pool sends it (rollout/engines.py), one
        # prompt's list of PNG data URLs, and a batch's list per prompt (a prompt without images: null)
        url = image_to_data_url(Image.new("RGB", (8, 8), (9, 9, 9)))
        await c.generate([5, 6, 7], sp, return_logprob=True, rid="v1", image_data=[url, url])
        await c.generate([[5, 6], [7, 8]], [sp, sp], return_logprob=True, rid=["v2", "v3"], image_data=[[url], None])
        await c.abort("s1")
        await c.abort()
        await c.pause_generation("abort")
        await c.continue_generation()
        await c.release_memory(["weights", "kv_cache"])
        await c.resume_memory(["weights"])
        await c.release_memory()
        await c.resume_memory()
        await c.update_weights_from_disk(str(tmp_path))
        for action in ("snapshot", "reset_tensors", "compare"):
            await c.check_weights(action)
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
                  "/destroy_weights_update_group", "/weights_checker"):
        assert r["accepted"].get(route), (route, r)
    assert r["unmapped"] == [], r["unmapped"]   # a new route of ours: map it to its SGLang class in ROUTES
    assert r["images"] == [[8, 8]] * 3, r["images"]   # the vision requests' image_data, decoded by SGLang itself


def test_cpu_engine_answers_have_the_fields_sglangs_own_code_builds(checked):
    """Same keys and value kinds as the answer SGLang's TokenizerManager builds for the same request and tokens,
    and the same finish_reason dict as SGLang's FINISH_* classes make (stop token / string, length, abort)."""
    r = checked["responses"]
    assert r["checked"] >= 7 and r["differences"] == [], r["differences"]
    for key in ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                "weight_version", "output_token_logprobs"):
        assert key in r["keys"], (key, r["keys"])


def test_router_command_is_read_by_the_routers_own_parser(checked):
    """build_router_command -> sglang_router's parse_router_args + Router.from_args (Rust config, not started)."""
    r = checked["router"]
    if "not_installed" in r and os.environ.get("CI", "").lower() != "true":
        pytest.skip("sglang-router not installed in the SGLang environment: run bench/vllm_peer/setup_env.sh")
    assert r["rejected"] == [] and r["mismatch"] == [], r
    assert r["checked"] >= 3

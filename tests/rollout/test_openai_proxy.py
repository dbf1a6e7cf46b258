"""Agents through the OpenAI API (rollout/openai_proxy.py, openai_agent.py): the official openai client drives each
sample against a real CPU engine; the trained tokens are exactly the generated ones, tool outputs masked out."""
import asyncio

import pytest

from slime_like.rollout.controller import RolloutController
from slime_like.rollout.openai_proxy import OpenAIProxy, parse_tool_calls
from slime_like.sample import Status

A = "rollout.openai_agents_for_tests"
GEN = "slime_like.rollout.openai_agent.generate"
ROWS = [{"q": f"{i}+{i}=", "a": str(2 * i)} for i in range(4)]


def _run(make_args, prompt_file, agent, **kw):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--rollout-max-response-len", 40, "--custom-generate-function-path", GEN,
                     "--agent-function-path", f"{A}.{agent}",
                     "--custom-rm-path", "rollout.hooks_for_tests.reward_length")
    return RolloutController(args, [args_engine[0]]).generate(0)


args_engine = []


@pytest.fixture(autouse=True)
def _engine(engine_url):
    args_engine[:] = [engine_url]


def test_two_turn_tool_loop_trains_exactly_the_generated_tokens(make_args, prompt_file, tiny_ckpt):
    from transformers import AutoTokenizer

    from rollout import openai_agents_for_tests as mod   # the module the rollout loads by name

    tok = AutoTokenizer.from_pretrained(tiny_ckpt)

    mod.SEEN.clear()
    samples, _ = _run(make_args, prompt_file, "two_turn_tool_agent")
    assert len(samples) == 4 and len(mod.SEEN) == 4
    seen = {s["index"]: s for s in mod.SEEN}
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.metadata["agent"]["calls"] == 2
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs)
        gen = [i for i, m in enumerate(s.loss_mask) if m == 1]
        n1, n2 = seen[s.index]["usage"]
        assert len(gen) == n1 + n2 > 0                                # every generated token is trained ...
        resp = s.tokens[-s.response_length:]
        # ... and they are the tokens the agent was answered with, turn by turn, in order
        assert tok.decode([resp[i] for i in gen[:n1]], skip_special_tokens=True) == seen[s.index]["answers"][0]
        assert tok.decode([resp[i] for i in gen[n1:]], skip_special_tokens=True) == seen[s.index]["answers"][1]
        masked = tok.decode([t for t, m in zip(resp, s.loss_mask) if m == 0])
        assert "<tool>7" in masked and "<assistant>" in masked        # the tool output and template: not trained
        assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m == 0)
        assert all(lp < 0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m == 1)
        prompt = tok.apply_chat_template([{"role": "user", "content": s.prompt}], tokenize=False,
                                         add_generation_prompt=True, tools=mod.TOOLS)
        assert s.tokens[:len(s.tokens) - s.response_length] == tok(prompt, add_special_tokens=False)["input_ids"]
        assert seen[s.index]["models"] == ["policy"]


def test_completions_endpoint(make_args, prompt_file, tiny_ckpt):
    from transformers import AutoTokenizer

    inserted = AutoTokenizer.from_pretrained(tiny_ckpt)(" then ", add_special_tokens=False)["input_ids"]
    samples, _ = _run(make_args, prompt_file, "completions_agent")
    for s in samples:
        assert s.metadata["agent"]["calls"] == 2 and s.loss_mask[-1] == 1
        start = s.loss_mask.index(0)       # the agent's inserted text: the only untrained tokens
        assert s.loss_mask.count(0) == len(inserted) and s.tokens[-s.response_length:][start:start + len(inserted)] \
            == inserted


def test_an_agent_that_never_calls_fails_its_sample(tiny_ckpt):
    from transformers import AutoTokenizer

    from slime_like.rollout.openai_agent import fill_sample
    from slime_like.rollout.openai_proxy import Session
    from slime_like.sample import Sample

    s = fill_sample(Sample(prompt="1+1="), Session(budget=8), AutoTokenizer.from_pretrained(tiny_ckpt))
    assert s.status == Status.FAILED and s.metadata["agent"] == {"calls": 0, "error": "the agent made no model call"}


def test_auth_loopback_and_refusals(engine_url, tiny_ckpt):
    import aiohttp
    from transformers import AutoTokenizer

    async def fake_generate(ids, params):
        return {"text": "x", "meta_info": {"output_token_logprobs": [[-0.5, 5, None]],
                                           "finish_reason": {"type": "length"}}}

    async def go():
        proxy = OpenAIProxy(AutoTokenizer.from_pretrained(tiny_ckpt), fake_generate, "sekret")
        await proxy.start()
        sid, base = proxy.open_session(10)
        assert base.startswith("http://127.0.0.1:")
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http:
            async with http.post(base + "/chat/completions", json=body) as r:
                assert r.status == 401
            hdr = {"Authorization": "Bearer sekret"}
            async with http.post(base + "/chat/completions", json=body, headers=hdr) as r:
                assert r.status == 200 and (await r.json())["choices"][0]["finish_reason"] == "length"
            edited = {"messages": [{"role": "user", "content": "changed"}, {"role": "assistant", "content": "x"},
                                   {"role": "user", "content": "more"}]}
            async with http.post(base + "/chat/completions", json=edited, headers=hdr) as r:
                assert r.status == 400 and "repeat the previous call" in (await r.json())["error"]["message"]
            async with http.post(base.replace(sid, "nope") + "/chat/completions", json=body, headers=hdr) as r:
                assert r.status == 404
        await proxy.stop()

    asyncio.run(go())


def test_hermes_tool_calls_are_parsed():
    text = 'ok <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> <tool_call>{bad}</tool_call>'
    (call,) = parse_tool_calls(text)
    assert call["function"]["name"] == "add" and call["function"]["arguments"] == '{"a": 1, "b": 2}'


def test_streaming_chat_trains_exactly_the_streamed_tokens(make_args, prompt_file, tiny_ckpt):
    """stream=True (server-sent events read by the official client): the streamed content of each turn is exactly
    what the trajectory trains for it, with the usage chunk's token count and a finish reason per turn."""
    from transformers import AutoTokenizer

    from rollout import openai_agents_for_tests as mod

    tok = AutoTokenizer.from_pretrained(tiny_ckpt)
    mod.SEEN.clear()
    samples, _ = _run(make_args, prompt_file, "streaming_tool_agent")
    assert len(samples) == 4 and len(mod.SEEN) == 4
    seen = {s["index"]: s for s in mod.SEEN}
    for s in samples:
        n1, n2 = seen[s.index]["usage"]
        gen = [i for i, m in enumerate(s.loss_mask) if m == 1]
        assert len(gen) == n1 + n2 > 0 and s.metadata["agent"]["calls"] == 2
        resp = s.tokens[-s.response_length:]
        assert tok.decode([resp[i] for i in gen[:n1]], skip_special_tokens=True) == seen[s.index]["answers"][0]
        assert tok.decode([resp[i] for i in gen[n1:]], skip_special_tokens=True) == seen[s.index]["answers"][1]
        assert len(seen[s.index]["finish"]) == 2 and set(seen[s.index]["finish"]) <= {"stop", "length"}
        assert seen[s.index]["pieces"][0] <= n1 and seen[s.index]["pieces"][1] <= n2   # at most one per token
    assert max(p for v in seen.values() for p in v["pieces"]) >= 2                      # in pieces, not one blob


def test_streaming_completions(make_args, prompt_file, tiny_ckpt):
    from transformers import AutoTokenizer

    from rollout import openai_agents_for_tests as mod

    tok = AutoTokenizer.from_pretrained(tiny_ckpt)
    inserted = tok(" then ", add_special_tokens=False)["input_ids"]
    mod.SEEN.clear()
    samples, _ = _run(make_args, prompt_file, "streaming_completions_agent")
    seen = {s["index"]: s for s in mod.SEEN}
    for s in samples:
        resp = s.tokens[-s.response_length:]
        start = s.loss_mask.index(0)
        assert s.loss_mask.count(0) == len(inserted) and resp[start:start + len(inserted)] == inserted
        assert tok.decode(resp[:start], skip_special_tokens=True) == seen[s.index]["answers"][0]


def test_streamed_tool_calls_and_refusals(tiny_ckpt):
    """A Hermes tool call streamed: the openai client assembles the same tool_calls as without streaming."""
    from openai import AsyncOpenAI
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_ckpt)
    call = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    ids = tok(call, add_special_tokens=False)["input_ids"]

    async def engine_answer(input_ids, params):   # what an engine answers when the model writes the call
        return {"text": call, "meta_info": {"output_token_logprobs": [[-0.1, t, None] for t in ids],
                                            "finish_reason": {"type": "stop"}}}

    async def go():
        proxy = OpenAIProxy(tok, engine_answer, "sekret")
        await proxy.start()
        try:
            _, base = proxy.open_session(500)
            client = AsyncOpenAI(base_url=base, api_key="sekret", max_retries=0)
            msgs = [{"role": "user", "content": "add"}]
            plain = await client.chat.completions.create(model="policy", messages=msgs, tools=[{"type": "function",
                                                         "function": {"name": "add", "parameters": {}}}])
            msgs += [{"role": "assistant", "content": plain.choices[0].message.content},
                     {"role": "tool", "tool_call_id": "call_0", "content": "1"}]
            chunks = [c async for c in await client.chat.completions.create(
                model="policy", messages=msgs, stream=True,
                tools=[{"type": "function", "function": {"name": "add", "parameters": {}}}])]
            calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
            assert [(tc.function.name, tc.function.arguments) for tc in calls] == \
                [(t.function.name, t.function.arguments) for t in plain.choices[0].message.tool_calls]
            assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]
            assert "".join(ch.delta.content or "" for c in chunks for ch in c.choices) == \
                plain.choices[0].message.content
            import openai
            with pytest.raises(openai.BadRequestError, match="stream_options needs stream: true"):
                await client.chat.completions.create(model="policy", messages=msgs + [
                    {"role": "assistant", "content": call}, {"role": "user", "content": "again"}],
                    stream_options={"include_usage": True})
        finally:
            await proxy.stop()

    asyncio.run(go())

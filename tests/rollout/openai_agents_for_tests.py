"""Agents for tests/rollout/test_openai_proxy.py: the official openai client in a two-turn tool-calling loop."""
from openai import OpenAI

TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two numbers",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "number"}, "b": {"type": "number"}}}}}]
SEEN = []      # what the agent saw, per sample (the test compares it with the trained tokens)


def two_turn_tool_agent(args, sample, base_url, api_key):
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": sample.prompt}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=6,
                                           temperature=1.0)
    reply = first.choices[0].message
    messages.append({"role": "assistant", "content": reply.content})
    # the tool runs whatever the model answered (a tiny random model writes no real call): its output goes back
    messages.append({"role": "tool", "tool_call_id": "call_0", "content": "7"})
    second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=5,
                                            temperature=1.0)
    SEEN.append({"index": sample.index, "answers": [reply.content, second.choices[0].message.content],
                 "usage": [first.usage.completion_tokens, second.usage.completion_tokens],
                 "models": [m.id for m in client.models.list().data]})
    sample.metadata["final"] = second.choices[0].message.content


async def completions_agent(args, sample, base_url, api_key):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    first = await client.completions.create(model="policy", prompt=sample.prompt, max_tokens=4)
    prompt = sample.prompt + first.choices[0].text + " then "
    await client.completions.create(model="policy", prompt=prompt, max_tokens=4)


def streaming_tool_agent(args, sample, base_url, api_key):
    """The two-turn tool loop with stream=True, reading the chunks as the openai client hands them out."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": sample.prompt}]
    answers, usage, pieces, finishes = [], [], [], []
    for turn, max_tokens in enumerate((6, 5)):
        stream = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=max_tokens,
                                                temperature=1.0, stream=True, stream_options={"include_usage": True})
        text, n = "", 0
        for chunk in stream:
            if chunk.usage is not None:
                usage.append(chunk.usage.completion_tokens)
            for choice in chunk.choices:
                if choice.delta.content:
                    text += choice.delta.content
                    n += 1
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
        answers.append(text)
        pieces.append(n)
        messages.append({"role": "assistant", "content": text})
        if turn == 0:
            messages.append({"role": "tool", "tool_call_id": "call_0", "content": "7"})
    SEEN.append({"index": sample.index, "answers": answers, "usage": usage, "pieces": pieces, "finish": finishes})


async def streaming_completions_agent(args, sample, base_url, api_key):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    text = ""
    async for chunk in await client.completions.create(model="policy", prompt=sample.prompt, max_tokens=4,
                                                       stream=True):
        text += "".join(c.text for c in chunk.choices)
    first = await client.completions.create(model="policy", prompt=sample.prompt + text + " then ", max_tokens=4)
    SEEN.append({"index": sample.index, "answers": [text, first.choices[0].text]})

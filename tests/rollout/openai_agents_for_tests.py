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

"""Agents through the OpenAI API: a generate function that hands each sample to a user's agent, which talks to the
rollout's engines only through the local OpenAI-compatible proxy (openai_proxy.py), and turns the session's token
trajectory into the sample.

    --custom-generate-function-path slime_like.rollout.openai_agent.generate
    --agent-function-path my_agents.solve      # [async] def solve(args, sample, base_url, api_key) -> None

The agent uses any OpenAI client (`OpenAI(base_url=base_url, api_key=api_key)`, LangGraph, the Agents SDK, ...);
a synchronous agent runs in a worker thread. The sample afterwards holds the trajectory as slime's multi-turn
samples do: tokens = first prompt + every later token; response = everything after the first prompt, loss mask 1
on generated tokens (with the engine's log-probs) and 0 on what the chat template inserted (tool outputs, user
turns); the reward functions see `sample.response` (the response tokens decoded) and `sample.metadata["agent"]`.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools

from ..sample import Sample, Status
from ..utils.auth import new_secret, resolve_api_key
from .engines import current_state
from .hooks import load_function
from .openai_proxy import OpenAIProxy

_PROXIES: dict = {}     # one proxy per (event loop, engine pool): the rollout's loop serves it


async def _proxy(state) -> OpenAIProxy:
    key = (id(asyncio.get_running_loop()), id(state.pool))
    proxy = _PROXIES.get(key)
    if proxy is None:
        pool, rids = state.pool, itertools.count()

        async def generate(input_ids, params):
            return await pool.generate(input_ids, params, rid=f"agent-{next(rids)}")

        secret = resolve_api_key(state.args.engine_api_key) or new_secret()
        proxy = OpenAIProxy(state.tokenizer, generate, secret)
        await proxy.start()
        _PROXIES[key] = proxy
    return proxy


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    if not args.agent_function_path:
        raise ValueError("--custom-generate-function-path slime_like.rollout.openai_agent.generate needs "
                         "--agent-function-path module.function (the agent that drives the sample)")
    agent = load_function(args.agent_function_path, "--agent-function-path")
    state = current_state()
    proxy = await _proxy(state)
    sid, base_url = proxy.open_session(sampling_params["max_new_tokens"])
    try:
        if inspect.iscoroutinefunction(agent):
            await agent(args, sample, base_url, proxy.api_key)
        else:
            await asyncio.to_thread(agent, args, sample, base_url, proxy.api_key)
    finally:
        session = proxy.close_session(sid)
    return fill_sample(sample, session, state.tokenizer)


def fill_sample(sample: Sample, session, tokenizer) -> Sample:
    """The session's trajectory as the sample (FAILED when the agent never called the model)."""
    sample.metadata["agent"] = {"calls": session.calls}
    if session.prompt_len is None or not session.mask:
        sample.status = Status.FAILED
        sample.metadata["agent"]["error"] = "the agent made no model call"
        return sample
    sample.tokens = list(session.tokens)
    sample.response_length = len(session.tokens) - session.prompt_len
    sample.loss_mask, sample.rollout_log_probs = list(session.mask), list(session.logps)
    sample.response = tokenizer.decode(session.tokens[session.prompt_len:], skip_special_tokens=True)
    sample.weight_versions = list(session.weight_versions)
    sample.status = {"length": Status.TRUNCATED, "abort": Status.ABORTED}.get(session.finish, Status.COMPLETED)
    sample.metadata["round_number"] = session.calls
    return sample

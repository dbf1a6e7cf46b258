"""The default generate sends each group as ONE batched /generate call (SGLang's batch form), with per-sample
semantics intact: concurrency bound, abort with partial output, continuation. Real engine over real HTTP."""
import asyncio

import pytest

from slime_like.backends.engine_api.client import EngineClient
from slime_like.rollout.controller import RolloutController
from slime_like.rollout.engines import EnginePool, set_current_state
from slime_like.rollout.generate import GenerateState, Slots, generate_group, sampling_params_from_args
from slime_like.sample import Status

H = "rollout.hooks_for_tests"
ROWS = [{"q": f"{i}+{i}=", "a": str(2 * i)} for i in range(6)]


def _engine_stats(url):
    async def go():
        async with EngineClient(url) as c:
            return (await c.get_server_info())["internal_states"][0]
    return asyncio.run(go())


@pytest.mark.parametrize("concurrency, calls", [(512, 3), (1, 6)])
def test_one_call_per_group_within_the_concurrency_bound(engine_url, prompt_file, make_args, concurrency, calls):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 3, "--n-samples-per-prompt", 2,
                     "--sglang-server-concurrency", concurrency, "--custom-rm-path", f"{H}.reward_length")
    before = _engine_stats(engine_url)["generate_calls"]
    samples, metrics = RolloutController(args, [engine_url]).generate(0)
    # 3 groups of 2: one call per group, or one per sample when only one sample may be in flight
    assert _engine_stats(engine_url)["generate_calls"] - before == calls
    assert sorted(s.index for s in samples) == list(range(6))
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.reward == float(s.response_length)
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0
        assert len(s.tokens) == s.prompt_length + s.response_length
    assert metrics["rollout/tokens_per_s"] > 0


def test_batched_group_abort_keeps_partial_output_and_continues(engine_url, prompt_file, make_args):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--n-samples-per-prompt", 3,
                     "--rollout-max-response-len", 200, "--custom-rm-path", f"{H}.reward_length")
    ctl = RolloutController(args, [engine_url])
    group = ctl.data_source.get_samples(1)[0]
    params = dict(sampling_params_from_args(args), ignore_eos=True)   # every response wants all 200 tokens

    async def first_pass():
        async with EnginePool([engine_url]) as pool, EngineClient(engine_url) as c:
            state = GenerateState(args, pool, ctl.tokenizer)
            set_current_state(state)
            start = (await c.get_server_info())["internal_states"][0]["generated_tokens"]
            task = asyncio.ensure_future(generate_group(args, group, params))
            while (await c.get_server_info())["internal_states"][0]["generated_tokens"] - start < 9:
                await asyncio.sleep(0.005)                        # all 3 rows are decoding
            await state.abort()
            await task

    asyncio.run(first_pass())
    cut = {}
    for s in group:
        assert s.status == Status.ABORTED and 0 < s.response_length < 200 and s.reward is None
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs)
        cut[s.index] = (list(s.tokens), list(s.rollout_log_probs))

    async def second_pass():                                      # partial rollout: continue, don't restart
        async with EnginePool([engine_url]) as pool:
            set_current_state(GenerateState(args, pool, ctl.tokenizer))
            await generate_group(args, group, params)

    asyncio.run(second_pass())
    for s in group:
        tokens, lps = cut[s.index]
        assert s.tokens[:len(tokens)] == tokens and s.rollout_log_probs[:len(lps)] == lps
        assert s.status == Status.TRUNCATED and s.response_length == 200 == len(s.rollout_log_probs)
        assert s.reward == 200.0


def test_slots_take_several_units_without_deadlock():
    async def go():
        slots, order = Slots(3), []

        async def taker(name, n, hold):
            await slots.acquire(n)
            order.append(name)
            await asyncio.sleep(hold)
            await slots.release(n)

        # a holds 2; b needs 3 and must wait for a; c (1 unit) queues behind b (FIFO), not around it
        await asyncio.gather(taker("a", 2, 0.05), taker("b", 3, 0.01), taker("c", 1, 0.0))
        assert order == ["a", "b", "c"] and slots.free == 3
        with pytest.raises(ValueError, match="cannot take 4 of 3"):
            await slots.acquire(4)
    asyncio.run(go())

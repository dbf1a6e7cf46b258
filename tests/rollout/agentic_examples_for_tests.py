"""slime's agentic examples (retool, search-r1, tau-bench) as their published interface: what each example's Python
imports from slime and how it calls it, written here so CI runs them without a slime checkout
(tests/rollout/test_slime_examples.py runs slime's own files when SLIME_SRC names one).

What each example's code does with our side, kept as it does it:
* retool (examples/retool/generate_with_retool.py): GenerateState(args).tokenizer, post() of input_ids to the
  router address in args with return_logprob, the engine's (log-prob, token) pairs appended with
  Sample.append_response_tokens, a <tool_call> JSON block run by a Python sandbox, its output appended untrained,
  extra attributes set on the Sample (tool_call_count), a dict reward from rm_hub's math_dapo_utils.compute_score
  (--reward-key score).
* search-r1 (examples/search-r1/generate_with_search.py): a text payload, <search>query</search> answered by a
  retrieval server (POST /retrieve {queries, topk, return_scores} -> result[query][passage]["document"]["contents"]),
  <information> appended untrained, tokens / loss_mask / rollout_log_probs reassigned whole at the end, a float
  exact-match reward against label["ground_truth"]["target"].
* tau-bench (examples/tau-bench/trainable_agents.py + generate_with_tau.py): the prompt is a task index, an
  environment answers each assistant turn (a tool result or the simulated user), the chat template applied to the
  whole conversation each turn (text payload, no log-probs), each turn's tokens the template's delta, and a NEW
  Sample built from the trajectory with status as a plain string ("completed").
* multi_agent (examples/multi_agent/rollout_with_multi_agents.py + agent_system.py): agents on deepcopies of the
  sample through post(), rewards from rm_hub's batched_async_rm set during generation and then re-weighted (0.8 for a
  wrong final answer), a list of samples returned (one per agent turn) sharing rollout_id = the input's index.
The tiny random model writes no real tool call or search: where it wrote none, the first turn's call is scripted
(as tests/rollout/test_openai_proxy.py's agent does), so the tool path runs every time.
"""
import asyncio
import json
import re
from copy import deepcopy

import aiohttp

from slime.rollout.rm_hub import batched_async_rm
from slime.rollout.rm_hub.math_dapo_utils import compute_score
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

TOOL_URL = {"url": None}        # the local tool / retrieval / environment stand-ins (the test sets them)


def _router(args) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"


async def _call_service(path: str, body: dict) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.post(TOOL_URL["url"] + path, json=body, timeout=aiohttp.ClientTimeout(total=30)) as r:
            r.raise_for_status()
            return await r.json()


def _finish(sample, finish: str) -> None:
    if sample.status is Sample.Status.PENDING or sample.status == "pending":
        sample.status = {"length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED}.get(
            finish, Sample.Status.COMPLETED)


# ------------------------------------------------------------------------------------------------------ retool
async def retool_generate(args, sample: Sample, sampling_params) -> Sample:
    state = GenerateState(args)
    sample.rollout_log_probs, sample.response, sample.response_length, sample.loss_mask = None, "", 0, []
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    tool_calls, finish = 0, "stop"
    for turn in range(2):
        output = await post(_router(args), {"input_ids": sample.tokens, "sampling_params": sampling_params,
                                            "return_logprob": True})
        finish = output["meta_info"]["finish_reason"]["type"]
        if finish == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        pairs = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[t for _, t, *_ in pairs], log_probs=[lp for lp, *_ in pairs],
                                      meta_info=output["meta_info"], text=output["text"])
        call = re.search(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", output["text"], re.S)
        code = json.loads(call.group(1))["arguments"]["code"] if call else ("print(6 * 7)" if turn == 0 else None)
        if code is None:
            break
        result = (await _call_service("/run", {"code": code}))["output"]
        tool_calls += 1
        obs = f"\n<interpreter>\n{result}\n</interpreter>\n"
        sample.append_response_tokens(args, tokens=state.tokenizer(obs, add_special_tokens=False)["input_ids"],
                                      trainable=False, text=obs)
    sample.tool_call_count = tool_calls            # retool stores it on the Sample for its reward
    _finish(sample, finish)
    return sample


async def retool_reward(args, sample, **kwargs):
    result = compute_score(sample.prompt + sample.response, sample.label, strict_box_verify=True)
    if result["score"] < 0:                        # retool's tool-use bonus on a wrong answer
        result["score"] = min(-0.6, result["score"] + (sample.tool_call_count - 2) / 2 * 0.1)
    return result


# --------------------------------------------------------------------------------------------------- search-r1
async def search_r1_generate(args, sample: Sample, sampling_params) -> Sample:
    state = GenerateState(args)
    prompt_ids = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    sample.tokens, response, response_ids, loss_mask, log_probs = list(prompt_ids), "", [], [], []
    for turn in range(2):
        output = await post(_router(args), {"text": sample.prompt + response, "sampling_params": sampling_params,
                                            "return_logprob": True})
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        pairs = output["meta_info"]["output_token_logprobs"]
        ids, lps = [t for _, t, *_ in pairs], [lp for lp, *_ in pairs]
        sample.append_response_tokens(args, tokens=ids, log_probs=lps, meta_info=output["meta_info"],
                                      text=output["text"])
        response += output["text"]
        response_ids += ids
        loss_mask += [1] * len(ids)
        log_probs += lps
        found = re.search(r"<search>(.*?)</search>", output["text"], re.S)
        query = found.group(1).strip() if found else ("who wrote it" if turn == 0 else None)
        if query is None:
            break
        found = await _call_service("/retrieve", {"queries": [query], "topk": 2, "return_scores": True})
        hits = found["result"][0]
        passages = "".join(f"Doc {i + 1}: {h['document']['contents']}\n" for i, h in enumerate(hits))
        obs = f"\n\n<information>{passages}</information>\n\n"
        obs_ids = state.tokenizer(obs, add_special_tokens=False)["input_ids"]
        sample.append_response_tokens(args, tokens=obs_ids, trainable=False)
        response += obs
        response_ids += obs_ids
        loss_mask += [0] * len(obs_ids)
        log_probs += [0.0] * len(obs_ids)
    # search-r1 reassigns the trajectory whole at the end
    sample.tokens, sample.response_length, sample.response = prompt_ids + response_ids, len(response_ids), response
    sample.loss_mask, sample.rollout_log_probs = loss_mask, log_probs
    _finish(sample, output["meta_info"]["finish_reason"]["type"])
    return sample


async def search_r1_reward(args, sample, **kwargs):
    answer = re.findall(r"<answer>(.*?)</answer>", sample.response, re.S)
    targets = sample.label["ground_truth"]["target"]
    return float(bool(answer) and answer[-1].strip().lower() in [t.lower() for t in targets])


# --------------------------------------------------------------------------------------------------- tau-bench
TAU_TOOLS = [{"type": "function", "function": {"name": "find_order", "description": "look an order up",
                                               "parameters": {"type": "object",
                                                              "properties": {"order_id": {"type": "string"}}}}}]


def _template(tokenizer, messages, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                         tools=TAU_TOOLS)


def _delta(tokenizer, messages, first_answer: bool = False) -> tuple[list[int], list[int]]:
    """tau-bench's token delta: the template's text of the whole conversation past the conversation without its
    last message. An assistant turn is trained, its generation prompt not (the first one is in the prompt); an
    environment turn (a tool result, the simulated user) is not."""
    prev = _template(tokenizer, messages[:-1], generation_prompt=False)
    curr = _template(tokenizer, messages, generation_prompt=False)
    if messages[-1]["role"] != "assistant":
        ids = tokenizer(curr[len(prev):], add_special_tokens=False)["input_ids"]
        return ids, [0] * len(ids)
    with_prompt = _template(tokenizer, messages[:-1], generation_prompt=True)
    head = [] if first_answer else tokenizer(with_prompt[len(prev):], add_special_tokens=False)["input_ids"]
    body = tokenizer(curr[len(with_prompt):], add_special_tokens=False)["input_ids"]
    return head + body, [0] * len(head) + [1] * len(body)


async def tau_generate(args, sample: Sample, sampling_params) -> Sample:
    assert not args.partial_rollout, "Partial rollout is not supported for tau-bench interactions."
    state = GenerateState(args)
    task_index = int(sample.prompt)
    env = await _call_service("/reset", {"task_index": task_index})
    messages = [{"role": "system", "content": env["wiki"]}, {"role": "user", "content": env["observation"]}]
    prompt_text = _template(state.tokenizer, messages, generation_prompt=True)
    prompt_ids = state.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    response_ids, loss_mask, status, reward, info = [], [], "truncated", 0.0, {}
    for turn in range(3):
        text = _template(state.tokenizer, messages, generation_prompt=True)
        output = await post(_router(args), {"text": text, "sampling_params": sampling_params})
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            status = "aborted"
            break
        messages.append({"role": "assistant", "content": output["text"]})
        ids, mask = _delta(state.tokenizer, messages, first_answer=not response_ids)
        response_ids, loss_mask = response_ids + ids, loss_mask + mask
        action = {"name": "find_order", "kwargs": {"order_id": "A1"}} if turn == 0 else \
            {"name": "respond", "kwargs": {"content": output["text"]}}
        step = await _call_service("/step", {"task_index": task_index, "action": action})
        messages.append({"role": "tool", "name": action["name"], "content": step["observation"]}
                        if action["name"] != "respond" else {"role": "user", "content": step["observation"]})
        ids, mask = _delta(state.tokenizer, messages)
        response_ids, loss_mask = response_ids + ids, loss_mask + mask
        reward, info = step["reward"], {**info, **step["info"]}
        if step["done"]:
            status = "completed"
            break
    result = Sample(index=task_index, prompt=prompt_text, tokens=prompt_ids + response_ids,
                    response="".join(m["content"] for m in messages if m["role"] == "assistant"),
                    reward=reward, loss_mask=loss_mask, status=status, metadata=info)
    result.response_length = len(loss_mask)
    return result


# -------------------------------------------------------------------------------------------------- multi_agent
async def _agent_turn(args, sample: Sample, sampling_params, prompt: str) -> Sample:
    """One agent's answer as its own training sample (a deepcopy of the prompt's sample), as multi_agent's
    generate_response builds it."""
    state = GenerateState(args)
    s = deepcopy(sample)
    output = await post(_router(args), {"text": prompt, "sampling_params": sampling_params, "return_logprob": True})
    pairs = output["meta_info"]["output_token_logprobs"]
    s.tokens = state.tokenizer(prompt, add_special_tokens=False)["input_ids"] + [t for _, t, *_ in pairs]
    s.response, s.response_length = output["text"], len(pairs)
    s.loss_mask, s.rollout_log_probs = [1] * len(pairs), [lp for lp, *_ in pairs]
    s.status = Sample.Status.TRUNCATED if output["meta_info"]["finish_reason"]["type"] == "length" else \
        Sample.Status.COMPLETED
    return s


async def multi_agent_generate(args, sample: Sample, sampling_params, evaluation=False) -> list:
    solvers = list(await asyncio.gather(*(_agent_turn(args, sample, sampling_params, f"Solve: {sample.prompt}")
                                          for _ in range(2))))
    for s, reward in zip(solvers, await batched_async_rm(args, solvers)):
        s.reward = reward
    picked = "\n".join(s.response for s in solvers)
    selector = await _agent_turn(args, sample, sampling_params, f"Pick the best of: {picked}")
    selector.reward = 0                                # no selection parsed from a random model's answer
    for s in solvers + [selector]:                     # the final answer is not correct: the 0.8 weight
        s.reward = s.reward * 0.8
        s.rollout_id = sample.index
    return solvers + [selector]

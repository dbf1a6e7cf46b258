"""Example ``--custom-generate-function-path``: multi-turn tool calling with a calculator tool.

    --custom-generate-function-path slime_like.rollout.multi_turn_example.generate

Each turn the model generates until it closes a tool call (stop string ``TOOL_END``, default
``</tool>``; override with ``args.tool_call_end``). The call is the text between the last
``<tool>`` and ``</tool>`` of that turn (the whole turn if there is no ``<tool>``); the environment
answers ``<result>VALUE</result>`` with the calculator's value (or an error message). The result's
tokens are appended to the sample with loss_mask 0 and log-prob 0.0: they were written by the
environment, not sampled from the policy, so the policy loss must ignore them. The loop ends when a
turn finishes without a tool call, at ``args.max_tool_turns`` (default 4) tool calls, or when the
response budget (``max_new_tokens`` over the whole response, tool output included) is spent.
"""
from __future__ import annotations

import ast
import operator

from ..sample import Sample, Status
from .engines import current_state
from .generate import append_engine_output

TOOL_START, TOOL_END = "<tool>", "</tool>"
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Evaluate + - * / over numbers (no names, no calls: safe on model-written text)."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("unsupported expression")
    try:
        return str(ev(ast.parse(expression.strip(), mode="eval")))
    except Exception as exc:  # the model sees the error and can try again
        return f"error: {type(exc).__name__}"


def _tool_call(turn_text: str, tool_end: str) -> str:
    body = turn_text[:turn_text.rfind(tool_end)] if tool_end in turn_text else turn_text
    return body.rsplit(TOOL_START, 1)[-1]


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    state = current_state()
    tool_end = args.tool_call_end
    budget = sampling_params["max_new_tokens"]
    stops = list(sampling_params.get("stop") or []) + [tool_end]
    for _ in range(int(args.max_tool_turns) + 1):
        remaining = budget - sample.response_length
        if remaining <= 0:
            sample.status = Status.TRUNCATED
            break
        before = len(sample.response)
        out = await state.engine_generate(sample.tokens, dict(sampling_params, max_new_tokens=remaining, stop=stops))
        append_engine_output(sample, out)
        finish = out["meta_info"].get("finish_reason") or {}
        if sample.status != Status.COMPLETED or finish.get("matched") != tool_end:
            break                                            # answered, truncated or aborted
        observation = f"<result>{calculator(_tool_call(sample.response[before:], tool_end))}</result>"
        obs_ids = state.tokenizer(observation, add_special_tokens=False)["input_ids"]
        obs_ids = obs_ids[:budget - sample.response_length]
        sample.tokens += obs_ids
        sample.response_length += len(obs_ids)
        sample.loss_mask += [0] * len(obs_ids)               # environment tokens: not trained on
        sample.rollout_log_probs += [0.0] * len(obs_ids)
        sample.response += state.tokenizer.decode(obs_ids)
        sample.metadata["tool_calls"] = sample.metadata.get("tool_calls", 0) + 1
    sample.metadata["round_number"] = sample.metadata.get("tool_calls", 0) + 1   # read by --log-multi-turn
    return sample

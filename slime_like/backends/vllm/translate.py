"""SGLang's native ``/generate`` <-> vLLM's ``/v1/completions``: pure functions, no I/O.

Request side: SGLang's sampling-parameter names (``io_struct.GenerateReqInput`` / ``SamplingParams``) become
the fields of vLLM's ``CompletionRequest``; token-id prompts go in as token ids, and vLLM is asked for the
generated token ids and one log-prob per token (``return_token_ids``, ``logprobs: 0``). A parameter with no
vLLM equivalent, or one the rollout does not use and we have not verified, is refused with a 400 naming it --
never dropped.

Response side: a ``CompletionResponse`` choice becomes SGLang's answer: ``text``, ``output_ids`` and
``meta_info`` with ``finish_reason`` (``stop`` + ``matched``, ``length``, ``abort``), token counts and
``output_token_logprobs`` as ``[logprob, token_id, None]`` triples.
"""
from __future__ import annotations

import difflib

from slime_like.backends.engine_api import protocol

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128   # SGLang's default; vLLM's completions default is 16

# SGLang sampling-parameter name -> vLLM CompletionRequest field (same meaning; checked in tests/vllm).
SAMPLING_MAP = {
    "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "temperature": "temperature",
    "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "stop": "stop", "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos", "skip_special_tokens": "skip_special_tokens", "no_stop_trim": "include_stop_str_in_output",
    "spaces_between_special_tokens": "spaces_between_special_tokens", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "repetition_penalty": "repetition_penalty", "sampling_seed": "seed",
    "logit_bias": "logit_bias",
}
# SGLang parameters vLLM's completions route cannot honour the same way: refused, with the reason.
REFUSED = {
    "n": "n > 1 answers several choices per prompt; send the prompt several times (the rollout does)",
    "regex": "constrained decoding is not wired through the vllm engine",
    "json_schema": "constrained decoding is not wired through the vllm engine",
    "ebnf": "constrained decoding is not wired through the vllm engine",
    "structural_tag": "constrained decoding is not wired through the vllm engine",
    "custom_params": "SGLang custom logit processors do not exist in vLLM",
}
TOP_LEVEL = {"input_ids", "text", "sampling_params", "return_logprob", "rid", "stream", "logprob_start_len",
             "top_logprobs_num", "return_text_in_logprobs", "input_embeds", "image_data", "lora_path", "session_params"}


class BadRequest(ValueError):
    """The SGLang request cannot be served by vLLM as asked (answered with HTTP 400)."""


def split_batch(body: dict) -> list[dict]:
    """SGLang's batch form (a list of prompts, per-prompt or shared sampling_params / rid) -> single requests."""
    unknown = set(body) - TOP_LEVEL
    if unknown:
        name = sorted(unknown)[0]
        raise BadRequest(f"/generate: unknown field {name!r}{_close(name, TOP_LEVEL)}")
    for key, why in (("stream", "streaming"), ("input_embeds", "embeddings as input"), ("image_data", "images"),
                     ("lora_path", "LoRA adapters"), ("session_params", "sessions")):
        if body.get(key):
            raise BadRequest(f"/generate: {key!r} ({why}) is not supported by the vllm engine adapter")
    if body.get("logprob_start_len", -1) not in (None, -1):
        raise BadRequest("/generate: logprob_start_len >= 0 (the prompt's own log-probs) is not supported by the vllm "
                         "engine adapter; the CPU engine and SGLang serve it")
    if body.get("top_logprobs_num"):
        raise BadRequest("/generate: top_logprobs_num is not supported by the vllm engine adapter "
                         "(the sampled token's log-prob is returned with return_logprob)")
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise BadRequest("/generate: give exactly one of input_ids or text")
    prompts = ids if ids is not None else text
    batched = isinstance(prompts, list) and (ids is None or (prompts and isinstance(prompts[0], list)))
    if not batched:
        return [body]
    n = len(prompts)
    sp, rid = body.get("sampling_params") or {}, body.get("rid")
    sps = sp if isinstance(sp, list) else [sp] * n
    rids = rid if isinstance(rid, list) else [None if rid is None else f"{rid}-{i}" for i in range(n)]
    if len(sps) != n or len(rids) != n:
        raise BadRequest(f"/generate: {n} prompts but {len(sps)} sampling_params and {len(rids)} rids")
    key = "input_ids" if ids is not None else "text"
    return [{**body, key: p, "sampling_params": s, "rid": r} for p, s, r in zip(prompts, sps, rids)]


def to_completion(req: dict, model: str, request_id: str) -> dict:
    """One SGLang /generate request (single form) -> a vLLM /v1/completions body."""
    sp = dict(req.get("sampling_params") or {})
    out = {"model": model, "request_id": request_id, "return_token_ids": True, "stream": False,
           "max_tokens": SGLANG_DEFAULT_MAX_NEW_TOKENS}
    if req.get("input_ids") is not None:
        ids = req["input_ids"]
        if not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise BadRequest("/generate: input_ids must be a non-empty list of token ids")
        out["prompt"] = ids
    else:
        out["prompt"] = req["text"]
    for name, value in sp.items():
        if name in REFUSED:
            if name == "n" and value in (None, 1):
                continue
            if value is None:
                continue
            raise BadRequest(f"sampling_params.{name}: {REFUSED[name]}")
        if name not in SAMPLING_MAP:
            raise BadRequest(f"sampling_params.{name}: unknown SGLang sampling parameter{_close(name, SAMPLING_MAP)}")
        if value is None:
            continue
        if name == "top_k" and value == -1:
            value = 0  # SGLang's "off" is -1; vLLM's is 0
        out[SAMPLING_MAP[name]] = value
    if req.get("return_logprob"):
        out["logprobs"] = 0                    # the sampled token's log-prob only
        out["return_tokens_as_token_ids"] = True
    return out


def from_completion(resp: dict, req: dict, rid: str, eos_ids: set, latency: float, weight_version: str) -> dict:
    """vLLM's completion answer (one choice) -> SGLang's /generate answer."""
    choice = resp["choices"][0]
    ids = list(choice.get("token_ids") or [])
    usage = resp.get("usage") or {}
    prompt = req.get("input_ids")
    meta = {"id": rid, "finish_reason": _finish_reason(choice, ids, eos_ids),
            "prompt_tokens": len(prompt) if prompt is not None else usage.get("prompt_tokens", 0),
            "completion_tokens": len(ids),
            "cached_tokens": ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
            "e2e_latency": latency, "weight_version": weight_version}
    if req.get("return_logprob"):
        lps = ((choice.get("logprobs") or {}).get("token_logprobs")) or []
        if len(lps) != len(ids):
            raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
        protocol.add_logprobs(meta, [[lp, t, None] for lp, t in zip(lps, ids)])
    return {"text": choice.get("text") or "", "output_ids": ids, "meta_info": protocol.with_sglang_counters(meta)}


def _finish_reason(choice: dict, ids: list, eos_ids: set) -> dict | None:
    reason, matched = choice.get("finish_reason"), choice.get("stop_reason")
    if reason == "length":
        return {"type": "length", "length": len(ids)}
    if reason == "abort":
        return protocol.sglang_finish_reason({"type": "abort", "message": "aborted"})
    if reason == "stop":
        if matched is None and ids and ids[-1] in eos_ids:
            matched = ids[-1]                  # vLLM leaves stop_reason empty for eos; SGLang names the token
        return {"type": "stop", "matched": matched}
    return None if reason is None else {"type": str(reason)}


def _close(name: str, options) -> str:
    m = difflib.get_close_matches(name, list(options), n=1)
    return f"; did you mean {m[0]!r}?" if m else ""

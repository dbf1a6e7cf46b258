"""SGLang's native /generate request and response shapes: the wire format every engine of ours speaks.

Neutral on purpose (no engine imports): ``parse_generate`` turns a JSON body into ``GenerateRequest`` records
that an engine converts into its own request objects, and ``build_response`` shapes any finished request that
has the attributes read below (``input_ids``, ``params``, ``output_ids``, ``output_logprobs``, ...).

Response per request (SGLang field names)::

    {"text": str, "output_ids": [int], "meta_info": {
        "id": rid, "finish_reason": {"type": "stop", "matched": id|str} | {"type": "length", "length": n}
                                    | {"type": "abort", "message": ...},
        "prompt_tokens": int, "completion_tokens": int, "cached_tokens": 0, "e2e_latency": s,
        "weight_version": str,
        "output_token_logprobs": [[logprob, token_id, None], ...]   # only with return_logprob
    }}

``output_ids`` and ``output_token_logprobs`` include a matched stop *token* (as SGLang's do; RL trains on the
eos token). ``text`` follows SGLang's detokenizer: a matched stop token is dropped, a matched stop string and
what follows it is cut, unless ``no_stop_trim``.
"""
from __future__ import annotations

from dataclasses import dataclass

_REQ_KEYS = {"text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
             "top_logprobs_num", "return_text_in_logprobs", "stream", "model", "lora_path", "custom_logit_processor",
             "token_ids_logprob", "return_hidden_states", "bootstrap_host", "bootstrap_room", "data_parallel_rank"}

# Fields SGLang accepts that the CPU engine only supports at their default (anything else is a clear error).
_DEFAULT_ONLY = {"top_logprobs_num": (None, 0), "logprob_start_len": (None, -1), "lora_path": (None,),
                 "custom_logit_processor": (None,), "token_ids_logprob": (None,), "return_hidden_states": (None, False),
                 "bootstrap_host": (None,), "bootstrap_room": (None,), "data_parallel_rank": (None, 0)}


class BadRequest(ValueError):
    """A request the engine refuses before doing any work (answered with HTTP 400)."""


@dataclass
class GenerateRequest:
    """One prompt of a /generate body, validated; ``sampling_params`` is the raw JSON object (or None)."""
    input_ids: list
    sampling_params: dict | None
    return_logprob: bool
    return_text_in_logprobs: bool
    rid: str | None


def parse_generate(body: dict, tokenizer) -> tuple[list[GenerateRequest], bool]:
    """JSON body -> (requests, is_batch). A batch is `input_ids: [[...], ...]` or `text: [..]`."""
    if not isinstance(body, dict):
        raise BadRequest("the /generate body must be a JSON object")
    unknown = set(body) - _REQ_KEYS
    if unknown:
        raise BadRequest(f"unknown /generate field(s) {sorted(unknown)}; expected some of {sorted(_REQ_KEYS)}")
    if body.get("stream"):
        raise BadRequest("stream=true is not supported by the CPU engine")
    for key, ok in _DEFAULT_ONLY.items():
        if key in body and body[key] not in ok:
            raise BadRequest(f"/generate field {key}={body[key]!r} is not supported by the CPU engine "
                             f"(allowed: {sorted(map(repr, ok))})")
    if (body.get("text") is None) == (body.get("input_ids") is None):
        raise BadRequest("give exactly one of 'text' or 'input_ids'")
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        is_batch = bool(ids) and isinstance(ids[0], list)
        prompts = ids if is_batch else [ids]
    else:
        is_batch = isinstance(body["text"], list)
        texts = body["text"] if is_batch else [body["text"]]
        prompts = [tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
    n = len(prompts)

    def per_item(key, default):
        v = body.get(key, default)
        if isinstance(v, list) and (is_batch or key == "sampling_params"):
            if len(v) != n:
                raise BadRequest(f"'{key}' has {len(v)} entries for a batch of {n} prompts")
            return v
        if key == "rid" and is_batch and v is not None:
            raise BadRequest("a batch request needs 'rid' as a list, one per prompt")
        return [v] * n

    params = per_item("sampling_params", None)
    rids = per_item("rid", None)
    logprob = per_item("return_logprob", False)
    with_text = bool(body.get("return_text_in_logprobs"))
    reqs = []
    for p, sp, rid, lp in zip(prompts, params, rids, logprob):
        if not all(isinstance(t, int) for t in p):
            raise BadRequest("input_ids must be a list of ints (or a list of such lists)")
        reqs.append(GenerateRequest(list(p), sp, bool(lp), with_text, None if rid is None else str(rid)))
    return reqs, is_batch


def build_response(r, tokenizer, weight_version: str) -> dict:
    p, fr = r.params, r.finish_reason or {}
    ids = r.output_ids
    matched = fr.get("matched")
    if not p.no_stop_trim and isinstance(matched, int) and not isinstance(matched, bool) and ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
    if not p.no_stop_trim and isinstance(matched, str):
        pos = text.find(matched)
        text = text[:pos] if pos != -1 else text
    meta = {"id": r.rid, "finish_reason": fr, "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(r.output_ids), "cached_tokens": 0,
            "e2e_latency": round(r.finished_at - r.created, 6), "weight_version": weight_version}
    if r.return_logprob:
        texts = ([tokenizer.decode([t]) for t in r.output_ids] if r.return_text_in_logprobs
                 else [None] * len(r.output_ids))
        meta["output_token_logprobs"] = [[lp, t, x] for lp, t, x in zip(r.output_logprobs, r.output_ids, texts)]
    return {"text": text, "output_ids": list(r.output_ids), "meta_info": meta}

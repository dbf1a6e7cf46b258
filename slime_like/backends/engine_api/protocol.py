"""SGLang's native /generate request and response shapes: the wire format every engine of ours speaks.

Neutral on purpose (no engine imports): ``parse_generate`` turns a JSON body into ``GenerateRequest`` records
that an engine converts into its own request objects, and ``build_response`` shapes any finished request that
has the attributes read below (``input_ids``, ``params``, ``output_ids``, ``output_logprobs``, ...).

Response per request (SGLang field names)::

    {"text": str, "output_ids": [int], "meta_info": {
        "id": rid, "finish_reason": {"type": "stop", "matched": id|str} | {"type": "length", "length": n}
                                    | {"type": "abort", "message": str, "status_code": ..., "err_type": ...},
        "prompt_tokens": int, "completion_tokens": int, "cached_tokens": 0, "e2e_latency": s,
        "weight_version": str, "num_retractions": 0, "reasoning_tokens": 0,
        # only with return_logprob (input_token_logprobs filled from logprob_start_len >= 0, else []):
        "input_token_logprobs": [], "output_token_logprobs": [[logprob, token_id, None], ...],
        "output_token_logprobs_length": int,
    }}

These are the keys SGLang 0.5.23's TokenizerManager puts in a finished non-streaming answer with its default
server flags (no --enable-metrics): tests/sglang_peer checks ours against the dict SGLang's own code builds.

``output_ids`` and ``output_token_logprobs`` include a matched stop *token* (as SGLang's do; RL trains on the
eos token). ``text`` follows SGLang's detokenizer: a matched stop token is dropped, a matched stop string and
what follows it is cut, unless ``no_stop_trim``.
"""
from __future__ import annotations

from dataclasses import dataclass

_REQ_KEYS = {"text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
             "top_logprobs_num", "return_text_in_logprobs", "stream", "model", "lora_path", "custom_logit_processor",
             "token_ids_logprob", "return_hidden_states", "return_routed_experts", "bootstrap_host", "bootstrap_room",
             "data_parallel_rank", "image_data",
             # SGLang fields that sglang-router 0.3 adds to every /generate it forwards (at their defaults)
             "background", "log_metrics", "no_logs", "return_bytes", "return_entropy"}

# Fields SGLang accepts that the CPU engine only supports at their default (anything else is a clear error).
_DEFAULT_ONLY = {"top_logprobs_num": (None, 0), "lora_path": (None,),
                 "custom_logit_processor": (None,), "token_ids_logprob": (None,), "return_hidden_states": (None, False),
                 "bootstrap_host": (None,), "bootstrap_room": (None,), "data_parallel_rank": (None, 0),
                 "background": (False,), "return_bytes": (False,), "return_entropy": (False,),
                 "log_metrics": (True, False), "no_logs": (False, True)}   # logging switches: no effect here


# Starts the message of a weight payload the engine's deserializer refused (tensor_serializer.PayloadRefused), so a
# server that relays only a worker's error text (the vllm adapter) still answers 400.
PAYLOAD_REFUSED = "weight payload refused: "


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
    logprob_start_len: int = -1        # >= 0: also score the prompt's tokens from this position (input_token_logprobs)
    return_routed_experts: bool = False   # MoE: the experts each token was routed to (rollout routing replay)
    image_data: list | None = None     # SGLang's field: this prompt's images (data URLs / base64), None: no image


MAX_TEXT_CHARS = 1 << 22   # default --max-text-chars: 4 Mi characters of prompt text per request
MAX_BATCH = 1 << 16


def _prompts(body: dict, tokenizer, max_text_chars: int) -> tuple[list[list[int]], bool]:
    """(token id lists, is_batch) from `input_ids` ([ids] or [[ids], ...]) or `text` (str or [str]), each checked."""
    if (body.get("text") is None) == (body.get("input_ids") is None):
        raise BadRequest("give exactly one of 'text' or 'input_ids'")
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise BadRequest(f"input_ids must be a non-empty list of token ids (or of such lists), got {ids!r:.100}")
        is_batch = isinstance(ids[0], list)
        prompts = ids if is_batch else [ids]
        if len(prompts) > MAX_BATCH:
            raise BadRequest(f"a batch holds at most {MAX_BATCH} prompts, got {len(prompts)}")
        for p in prompts:
            if not isinstance(p, list) or not all(type(t) is int for t in p):
                raise BadRequest("input_ids must be a list of ints (or a list of such lists); booleans, floats, "
                                 "strings and deeper nesting are refused")
        return prompts, is_batch
    text = body["text"]
    is_batch = isinstance(text, list)
    texts = text if is_batch else [text]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest(f"text must be a string or a non-empty list of strings, got {text!r:.100}")
    total = sum(len(t) for t in texts)
    if total > max_text_chars:
        raise BadRequest(f"text holds {total} characters; this engine takes at most {max_text_chars} per request "
                         f"(--max-text-chars); send token ids or smaller requests")
    return [tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts], is_batch


def parse_generate(body: dict, tokenizer, max_text_chars: int = MAX_TEXT_CHARS) -> tuple[list[GenerateRequest], bool]:
    """JSON body -> (requests, is_batch). A batch is `input_ids: [[...], ...]` or `text: [..]`.

    Every field is checked (type, range, size) and refused with BadRequest (HTTP 400) naming it; the server
    runs this off the event loop, since tokenizing a large `text` takes a while."""
    if not isinstance(body, dict):
        raise BadRequest("the /generate body must be a JSON object")
    unknown = set(body) - _REQ_KEYS
    if unknown:
        raise BadRequest(f"unknown /generate field(s) {sorted(unknown)}; expected some of {sorted(_REQ_KEYS)}")
    for key in ("stream", "return_text_in_logprobs", "return_routed_experts"):
        if not isinstance(body.get(key, False), bool):
            raise BadRequest(f"/generate field {key} must be true or false, got {body[key]!r:.100}")
    if body.get("stream"):
        raise BadRequest("stream=true is not supported by the CPU engine")
    for key, ok in _DEFAULT_ONLY.items():
        if key in body and not any(body[key] is v or (type(body[key]) is type(v) and body[key] == v) for v in ok):
            raise BadRequest(f"/generate field {key}={body[key]!r:.100} is not supported by the CPU engine "
                             f"(allowed: {sorted(map(repr, ok))})")
    prompts, is_batch = _prompts(body, tokenizer, max_text_chars)
    n = len(prompts)

    def per_item(key, default, types, what):
        v = body.get(key, default)
        if isinstance(v, list) and (is_batch or key == "sampling_params"):
            if len(v) != n:
                raise BadRequest(f"'{key}' has {len(v)} entries for a batch of {n} prompts")
            values = v
        elif key == "rid" and is_batch and v is not None:
            raise BadRequest("a batch request needs 'rid' as a list, one per prompt")
        else:
            values = [v] * n
        for x in values:
            if x is not None and not isinstance(x, types):
                raise BadRequest(f"/generate field {key} must be {what}, got {x!r:.100}")
        return values

    sps = per_item("sampling_params", None, dict, "a JSON object (or one per prompt)")
    rids = per_item("rid", None, str, "a string (a list of strings for a batch)")
    logprob = per_item("return_logprob", False, bool, "true or false")
    with_text = bool(body.get("return_text_in_logprobs"))
    starts = per_item("logprob_start_len", -1, int, "an integer (-1: no prompt log-probs)")
    for p, start in zip(prompts, starts):
        start = -1 if start is None else start
        if isinstance(start, bool) or not -1 <= start < len(p):
            raise BadRequest(f"/generate field logprob_start_len={start!r} must be -1 or a position in the prompt "
                             f"[0, {len(p) - 1}]")
    routed = bool(body.get("return_routed_experts"))
    images = _image_data(body.get("image_data"), n, is_batch)
    reqs = [GenerateRequest(list(p), sp, bool(lp), with_text, rid, -1 if start is None else start, routed, im)
            for p, sp, rid, lp, start, im in zip(prompts, sps, rids, logprob, starts, images)]
    return reqs, is_batch


def _image_data(value, n: int, is_batch: bool) -> list:
    """SGLang's image_data per prompt: one prompt takes an image or a list of images; a batch takes one such
    entry per prompt (None / [] for a prompt without images). Each image is a string (the engine decides which
    forms it reads)."""
    if value is None:
        return [None] * n
    entries = value if is_batch else [value]
    if is_batch and (not isinstance(value, list) or len(value) != n):
        raise BadRequest(f"image_data of a batch of {n} prompts must be a list of {n} entries (one per prompt)")
    out = []
    for e in entries:
        items = [] if e is None else e if isinstance(e, list) else [e]
        if not all(isinstance(x, str) for x in items):
            raise BadRequest("image_data entries must be strings (data:image/...;base64, URLs or base64)")
        out.append(items or None)
    return out


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
    meta = {"id": r.rid, "finish_reason": sglang_finish_reason(fr), "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(r.output_ids), "cached_tokens": 0,
            "e2e_latency": round(r.finished_at - r.created, 6), "weight_version": weight_version}
    if r.return_logprob:
        texts = ([tokenizer.decode([t]) for t in r.output_ids] if r.return_text_in_logprobs
                 else [None] * len(r.output_ids))
        add_logprobs(meta, [[lp, t, x] for lp, t, x in zip(r.output_logprobs, r.output_ids, texts)])
        start = getattr(r, "logprob_start_len", -1)
        if start >= 0:  # SGLang: [logprob, id, text] per prompt token from start; the very first token has None
            prompt = r.input_ids[start:]
            ptexts = [tokenizer.decode([t]) for t in prompt] if r.return_text_in_logprobs else [None] * len(prompt)
            meta["input_token_logprobs"] = [[lp, t, x] for lp, t, x in zip(r.input_logprobs, prompt, ptexts)]
    if getattr(r, "return_routed_experts", False):   # SGLang's fields: base64 int32 [tokens - 1, layers, top_k]
        meta["routed_experts"], meta["routed_experts_start_len"] = r.routed_experts_b64(), 0
    return {"text": text, "output_ids": list(r.output_ids), "meta_info": with_sglang_counters(meta)}


def sglang_finish_reason(fr: dict | None) -> dict | None:
    """SGLang's abort reason always carries status_code and err_type (None unless an error caused it)."""
    if fr and fr.get("type") == "abort":
        return {"status_code": None, "err_type": None, **fr}
    return fr


def add_logprobs(meta: dict, output_token_logprobs: list) -> None:
    """SGLang's log-prob keys: no prompt log-probs by default (logprob_start_len -1 starts after the prompt)."""
    meta["input_token_logprobs"] = []
    meta["output_token_logprobs"] = output_token_logprobs
    meta["output_token_logprobs_length"] = len(output_token_logprobs)


def with_sglang_counters(meta: dict) -> dict:
    """Counters SGLang always reports that are constant here: no retraction (no KV pressure scheduling), no
    reasoning parser."""
    meta.setdefault("num_retractions", 0)
    meta.setdefault("reasoning_tokens", 0)
    return meta

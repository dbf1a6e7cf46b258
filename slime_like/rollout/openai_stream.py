"""`stream: true` for the OpenAI-compatible proxy (openai_proxy.py): server-sent events as OpenAI's API sends them.

The engine answers a call whole (SGLang's non-streaming /generate, what the rollout's pool speaks), so the answer is
recorded in the trajectory first and then sent as chunks, one per generated token's text: a streaming client
(openai's `stream=True`, agent frameworks that always stream) reads the same content, tool calls, finish reason and
usage as without streaming; only the first token arrives no earlier than the last.
    data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {...}, "finish_reason": null}]}
    ...
    data: [DONE]
"""
from __future__ import annotations

import json

from aiohttp import web


def text_pieces(tokenizer, ids: list[int], text: str) -> list[str]:
    """The answer's text split per generated token (a few tokens of context decode each, so a character spread over
    several byte tokens comes whole); the pieces always join to exactly `text`."""
    pieces, emitted = [], ""
    for i in range(len(ids)):
        lo = max(0, i - 6)
        before = tokenizer.decode(ids[lo:i], skip_special_tokens=True)
        now = tokenizer.decode(ids[lo:i + 1], skip_special_tokens=True)
        piece = now[len(before):] if now.startswith(before) and not now.endswith("\ufffd") else ""
        if piece and text.startswith(emitted + piece):
            pieces.append(piece)
            emitted += piece
    if emitted != text:
        pieces.append(text[len(emitted):])
    return pieces


def chat_chunks(envelope: dict, pieces: list[str], message: dict, finish: str, with_usage: bool) -> list[dict]:
    """The chunks of one chat answer: the role, each piece of content, the tool calls, the finish reason, usage."""
    def chunk(delta, finish_reason=None):
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    head = {k: envelope[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    out = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": p}) for p in pieces]
    if message.get("tool_calls"):
        out.append(chunk({"tool_calls": [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]}))
    out.append(chunk({}, finish))
    if with_usage:   # stream_options.include_usage: a last chunk with no choices
        out.append({**head, "choices": [], "usage": envelope["usage"]})
    return out


def completion_chunks(envelope: dict, pieces: list[str], finish: str, with_usage: bool) -> list[dict]:
    head = {k: envelope[k] for k in ("id", "created", "model")} | {"object": "text_completion"}
    out = [{**head, "choices": [{"index": 0, "text": p, "logprobs": None, "finish_reason": None}]} for p in pieces]
    out.append({**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish}]})
    if with_usage:
        out.append({**head, "choices": [], "usage": envelope["usage"]})
    return out


async def send_events(request, chunks: list[dict]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for c in chunks:
        await resp.write(b"data: " + json.dumps(c).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp

"""An OpenAI-compatible endpoint in front of the rollout's engines, for agent frameworks (openai_agent.py runs them).

    POST /s/{session}/v1/chat/completions   messages (+ tools) -> the chat template -> /generate through the pool
    POST /s/{session}/v1/completions        prompt text -> /generate
    (either with "stream": true: server-sent events, openai_stream.py)
    GET  /s/{session}/v1/models

Each sample's agent gets its own session in the base URL. The session records one token trajectory, as slime's
multi-turn generate functions build it: the first call's prompt, then per call the tokens the template adds
since the previous answer (tool outputs, new user turns, the generation prompt: loss mask 0) and the generated
tokens (mask 1, with the engine's log-probs). The engine always continues from exactly those tokens, so what is
trained is what was generated: each call's history must extend the previous one (the previous answer rendered as
its raw text), else the call is refused (400) rather than silently re-tokenized.

Loopback only; every request needs `Authorization: Bearer <the run's secret>` (openai's api_key).
"""
from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass, field

from aiohttp import web

from ..utils.auth import authorized
from . import openai_stream

TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
MAX_BODY = 16 << 20


class ProxyError(ValueError):
    """A request the proxy refuses (HTTP 400, OpenAI's error shape)."""


@dataclass
class Session:
    budget: int                          # response tokens left (--rollout-max-response-len over the whole trajectory)
    tokens: list = field(default_factory=list)
    mask: list = field(default_factory=list)
    logps: list = field(default_factory=list)
    prompt_len: int | None = None
    messages: list | None = None         # the last chat call's messages and its raw answer text
    raw: str = ""
    text: str | None = None              # completions: the last prompt + answer
    finish: str | None = None
    weight_versions: list = field(default_factory=list)
    calls: int = 0


def parse_tool_calls(text: str) -> list[dict]:
    """Hermes-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks as OpenAI tool_calls."""
    calls = []
    for i, m in enumerate(TOOL_CALL.finditer(text)):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            calls.append({"id": f"call_{i}", "type": "function",
                          "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))}})
    return calls


def _same_turn(a: dict, b: dict) -> bool:
    return a.get("role") == b.get("role") and (a.get("content") or "") == (b.get("content") or "")


class OpenAIProxy:
    """One per rollout process; `generate(input_ids, params) -> SGLang answer` is the rollout's engine call."""

    def __init__(self, tokenizer, generate, api_key: str, model_name: str = "policy"):
        self.tokenizer, self.generate, self.api_key, self.model_name = tokenizer, generate, api_key, model_name
        self.sessions: dict[str, Session] = {}
        self._ids = itertools.count()
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._auth])
        app.router.add_post("/s/{sid}/v1/chat/completions", self._chat)
        app.router.add_post("/s/{sid}/v1/completions", self._completions)
        app.router.add_get("/s/{sid}/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)       # loopback only: the agents run beside the rollout
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open_session(self, budget: int) -> tuple[str, str]:
        """(session id, base URL for the agent's OpenAI client)."""
        sid = f"s{next(self._ids)}"
        self.sessions[sid] = Session(budget=int(budget))
        return sid, f"http://127.0.0.1:{self.port}/s/{sid}/v1"

    def close_session(self, sid: str) -> Session:
        return self.sessions.pop(sid)

    # ------------------------------------------------------------------ HTTP
    @web.middleware
    async def _auth(self, request, handler):
        if not authorized(request.headers.get("Authorization"), self.api_key):
            return _error(401, "missing or wrong API key (Authorization: Bearer <the run's secret>)")
        if request.match_info.get("sid") not in self.sessions:
            return _error(404, "no such agent session (it ended, or the URL is not one the rollout handed out)")
        try:
            return await handler(request)
        except ProxyError as exc:
            return _error(400, str(exc))

    async def _models(self, request):
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def _body(self, request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ProxyError("the body is not JSON") from None
        if not isinstance(body, dict):
            raise ProxyError("the body must be a JSON object")
        if not isinstance(body.get("stream", False), bool):
            raise ProxyError("stream must be true or false")
        options = body.get("stream_options")
        if options is not None and (not body.get("stream") or not isinstance(options, dict)):
            raise ProxyError("stream_options needs stream: true and must be an object")
        if body.get("n", 1) != 1:
            raise ProxyError("n must be 1 (one trajectory per session)")
        return body

    async def _chat(self, request):
        s, body = self.sessions[request.match_info["sid"]], await self._body(request)
        messages, tools = body.get("messages"), body.get("tools")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ProxyError("messages must be a non-empty list of message objects")
        delta = self._chat_delta(s, messages, tools)
        out, ids = await self._run(s, delta, body)
        raw = self.tokenizer.decode(ids, skip_special_tokens=True)
        s.messages, s.raw = [dict(m) for m in messages], raw
        calls = parse_tool_calls(raw) if tools else []
        message = {"role": "assistant", "content": raw}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else _finish(out)
        envelope = _envelope("chat.completion", self.model_name, len(s.tokens), ids,
                             {"index": 0, "message": message, "finish_reason": finish})
        if body.get("stream"):
            pieces = openai_stream.text_pieces(self.tokenizer, ids, raw)
            return await openai_stream.send_events(request, openai_stream.chat_chunks(
                envelope, pieces, message, finish, _with_usage(body)))
        return web.json_response(envelope)

    async def _completions(self, request):
        s, body = self.sessions[request.match_info["sid"]], await self._body(request)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ProxyError("prompt must be one string")
        if s.text is None and s.prompt_len is None:
            delta = self._ids_of(prompt)
        elif s.text is not None and prompt.startswith(s.text):
            delta = self._ids_of(prompt[len(s.text):])
        else:
            raise ProxyError("the prompt must extend the previous prompt and answer (the trajectory is trained "
                             "token for token)")
        out, ids = await self._run(s, delta, body)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        s.text = prompt + text
        envelope = _envelope("text_completion", self.model_name, len(s.tokens), ids,
                             {"index": 0, "text": text, "finish_reason": _finish(out)})
        if body.get("stream"):
            pieces = openai_stream.text_pieces(self.tokenizer, ids, text)
            return await openai_stream.send_events(request, openai_stream.completion_chunks(
                envelope, pieces, _finish(out), _with_usage(body)))
        return web.json_response(envelope)

    # ------------------------------------------------------------------ the trajectory
    def _ids_of(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _render(self, messages, tools) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    def _chat_delta(self, s: Session, messages: list, tools) -> list[int]:
        """The tokens to add before generating: the whole prompt first, then what the template writes after the
        previous answer (that answer rendered as the raw text generated, so tool-call formatting cannot differ)."""
        if s.messages is None:
            return self._ids_of(self._render(messages, tools))
        k = len(s.messages)
        if len(messages) <= k or not all(_same_turn(a, b) for a, b in zip(s.messages, messages)) \
                or messages[k].get("role") != "assistant":
            raise ProxyError("messages must repeat the previous call's messages and its assistant answer, then add "
                             "the new turns (the trajectory is trained token for token)")
        base = self._render(s.messages, tools) + s.raw
        full = self._render(s.messages + [{"role": "assistant", "content": s.raw}] + messages[k + 1:], tools)
        if not full.startswith(base):
            raise ProxyError("the chat template renders the earlier turns differently once new ones are added, so "
                             "the trajectory cannot be extended token for token")
        tail = full[len(base):]
        if s.tokens and s.tokens[-1] in set(self.tokenizer.all_special_ids):
            last = self.tokenizer.decode(s.tokens[-1:])   # an end-of-turn token the answer's text left out
            tail = tail[len(last):] if last and tail.startswith(last) else tail
        return self._ids_of(tail)

    async def _run(self, s: Session, delta: list[int], body: dict) -> tuple[dict, list[int]]:
        if s.prompt_len is None:
            if not delta:
                raise ProxyError("empty prompt")
            s.tokens, s.prompt_len = list(delta), len(delta)
        else:
            s.tokens += delta
            s.mask += [0] * len(delta)
            s.logps += [0.0] * len(delta)
        want = body.get("max_completion_tokens") or body.get("max_tokens") or s.budget
        params = {"max_new_tokens": max(0, min(int(want), s.budget - len(s.mask))), "no_stop_trim": True}
        for key, name in (("temperature", "temperature"), ("top_p", "top_p"), ("stop", "stop")):
            if body.get(key) is not None:
                params[name] = body[key] if key != "stop" or isinstance(body[key], list) else [body[key]]
        out = await self.generate(list(s.tokens), params)
        meta = out.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs") or []
        ids = [int(t) for _, t, *_ in pairs]
        s.tokens += ids
        s.mask += [1] * len(ids)
        s.logps += [float(lp) for lp, *_ in pairs]
        s.finish = (meta.get("finish_reason") or {}).get("type")
        if ids and meta.get("weight_version") is not None:
            s.weight_versions.append(str(meta["weight_version"]))
        s.calls += 1
        return out, ids


def _with_usage(body: dict) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def _finish(out: dict) -> str:
    kind = ((out.get("meta_info") or {}).get("finish_reason") or {}).get("type")
    return {"length": "length", "abort": "stop"}.get(kind, "stop")


def _envelope(kind: str, model: str, total: int, ids: list, choice: dict) -> dict:
    return {"id": f"{kind}-{time.time_ns()}", "object": kind, "created": int(time.time()), "model": model,
            "choices": [choice],
            "usage": {"prompt_tokens": total - len(ids), "completion_tokens": len(ids), "total_tokens": total}}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": status}},
                             status=status)

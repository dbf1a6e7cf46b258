"""The one HTTP client of SGLang's native API (real SGLang, the sglang-router, the embedded CPU engine), used by
the rollout (async, pooled) and by weight sync (`post`, a thin sync wrapper for threads without an event loop).

    async with EngineClient("http://127.0.0.1:30000") as c:
        out = await c.generate([1, 2, 3], {"temperature": 1.0, "max_new_tokens": 64}, return_logprob=True)
        out["output_ids"], out["meta_info"]["finish_reason"]["type"]
        [lp for lp, tok, _ in out["meta_info"]["output_token_logprobs"]]

Every error names the URL and endpoint: ``EngineError`` for an HTTP error answer (with the server's message),
``EngineUnreachable`` when the connection fails or times out (the engine is down or wedged).
"""
from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp

from slime_like.utils.auth import auth_headers


class EngineError(RuntimeError):
    """The engine answered with an error status."""

    def __init__(self, url: str, status: int, message: str):
        super().__init__(f"{url} -> HTTP {status}: {message}")
        self.url, self.status, self.message = url, status, message


class EngineUnreachable(EngineError):
    """No answer: connection refused / reset, or the request timed out."""

    def __init__(self, url: str, reason: str):
        RuntimeError.__init__(self, f"{url} unreachable: {reason}")
        self.url, self.status, self.message = url, None, reason


class EngineClient:
    """One engine (or router) base URL. Pass a shared ``aiohttp.ClientSession`` to pool connections."""

    def __init__(self, url: str, session: aiohttp.ClientSession | None = None, timeout: float | None = 3600.0,
                 connect_timeout: float = 10.0, api_key: str | None = None):
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        self.url = url.rstrip("/")
        # Without a shared session each call opens and closes its own, so a throwaway client leaks nothing;
        # pass one session (or use `async with EngineClient(...)`) to pool connections for heavy traffic.
        self._session, self._own_session = session, False
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self.headers = auth_headers(api_key)  # the run's engine secret (default: $SLIME_LIKE_ENGINE_API_KEY)

    async def __aenter__(self):
        if self._session is None:
            self._session, self._own_session = aiohttp.ClientSession(timeout=self.timeout), True
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session, self._own_session = None, False

    async def request(self, method: str, path: str, payload: dict | None = None, timeout: float | None = None):
        """Send one request; return parsed JSON (or text / None for empty bodies). Raises EngineError."""
        url = self.url + path
        kw = {"json": payload} if payload is not None else {}
        kw["headers"] = self.headers
        if timeout is not None:
            kw["timeout"] = aiohttp.ClientTimeout(total=timeout)
        session = self._session if self._session is not None and not self._session.closed else None
        try:
            async with _maybe_session(session, self.timeout) as sess, sess.request(method, url, **kw) as resp:
                body = await resp.read()
                text = body.decode("utf-8", "replace")
                if resp.status >= 400:
                    raise EngineError(url, resp.status, _error_message(text))
                if not body:
                    return None
                if resp.content_type == "application/json":
                    return json.loads(text)
                return text
        except EngineError:
            raise
        except asyncio.TimeoutError:
            raise EngineUnreachable(url, f"no answer within {timeout or self.timeout.total}s") from None
        except aiohttp.ClientError as e:
            raise EngineUnreachable(url, f"{type(e).__name__}: {e}") from None

    # ------------------------------------------------------------------ generation
    async def generate(self, input_ids: list[int] | list[list[int]], sampling_params: dict | list[dict],
                       return_logprob: bool = True, rid: str | list[str] | None = None, **extra) -> dict | list[dict]:
        """POST /generate. One prompt -> one response dict; a list of prompts -> a list of responses."""
        payload = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob}
        if rid is not None:
            payload["rid"] = rid
        payload.update(extra)
        return await self.request("POST", "/generate", payload)

    async def abort(self, rid: str | None = None) -> None:
        """Abort one request by rid, or every request on the engine when rid is None."""
        await self.request("POST", "/abort_request", {"rid": rid} if rid else {"abort_all": True})

    async def pause_generation(self, mode: str = "abort"):
        return await self.request("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self):
        return await self.request("POST", "/continue_generation", {})

    # ------------------------------------------------------------------ status
    async def health(self, generate: bool = True, timeout: float | None = 30.0) -> bool:
        """True if the engine answers /health_generate (or /health); False if unreachable or unhealthy."""
        try:
            await self.request("GET", "/health_generate" if generate else "/health", timeout=timeout)
            return True
        except EngineError:
            return False

    async def get_model_info(self) -> dict:
        return await self.request("GET", "/get_model_info")

    async def get_server_info(self) -> dict:
        return await self.request("GET", "/get_server_info")

    async def flush_cache(self):
        return await self.request("POST", "/flush_cache")

    async def check_weights(self, action: str) -> dict:
        """SGLang's /weights_checker: 'snapshot', 'reset_tensors' or 'compare' (an HTTP error when they differ)."""
        return await self.request("POST", "/weights_checker", {"action": action})

    # ------------------------------------------------------------------ weights / memory
    async def update_weights_from_disk(self, path: str, **extra) -> dict:
        return _check(self.url, await self.request("POST", "/update_weights_from_disk", {"model_path": path, **extra}))

    async def update_weights_from_tensor(self, serialized_named_tensors: list, load_format: str | None = None,
                                         flush_cache: bool = True, **extra) -> dict:
        payload = {"serialized_named_tensors": serialized_named_tensors, "load_format": load_format,
                   "flush_cache": flush_cache, **extra}
        return _check(self.url, await self.request("POST", "/update_weights_from_tensor", payload))

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str = "weight_update_group",
                                        backend: str = "nccl") -> dict:
        payload = dict(master_address=master_address, master_port=master_port, rank_offset=rank_offset,
                       world_size=world_size, group_name=group_name, backend=backend)
        return _check(self.url, await self.request("POST", "/init_weights_update_group", payload))

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                              group_name: str = "weight_update_group", flush_cache: bool = True,
                                              **extra) -> dict:
        payload = dict(names=names, dtypes=dtypes, shapes=shapes, group_name=group_name, flush_cache=flush_cache,
                       **extra)
        return _check(self.url, await self.request("POST", "/update_weights_from_distributed", payload))

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        return await self.request("POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def release_memory(self, tags: list[str] | None = None) -> dict:
        return await self.request("POST", "/release_memory_occupation", {"tags": tags} if tags else {})

    async def resume_memory(self, tags: list[str] | None = None) -> dict:
        return await self.request("POST", "/resume_memory_occupation", {"tags": tags} if tags else {})


def post(url: str, path: str, payload: dict | None = None, timeout: float = 600.0, api_key: str | None = None):
    """Synchronous POST of one JSON body (weight sync runs in plain threads): the same answers and errors as
    `EngineClient.request`, and a 200 answer with ``success: false`` raises too. Not for a running event loop.
    `api_key`: the run's engine secret (default: $SLIME_LIKE_ENGINE_API_KEY)."""
    async def once():
        async with EngineClient(url, timeout=timeout, api_key=api_key) as client:
            return _check(client.url + path, await client.request("POST", path, payload if payload is not None else {}))

    return asyncio.run(once())


@contextlib.asynccontextmanager
async def _maybe_session(session, timeout):
    if session is not None:
        yield session
    else:
        async with aiohttp.ClientSession(timeout=timeout) as s:
            yield s


def _error_message(text: str) -> str:
    try:
        j = json.loads(text)
    except ValueError:
        return text[:2000]
    if isinstance(j, dict):
        err = j.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in j:
            return str(j["message"])
    return text[:2000]


def _check(url: str, resp) -> dict:
    """Weight endpoints answer 200 with success=false on failure in some SGLang versions: raise on it."""
    if isinstance(resp, dict) and resp.get("success") is False:
        raise EngineError(url, 200, str(resp.get("message")))
    return resp

"""Running a coroutine to completion from synchronous code (slime's slime.utils.async_utils.run): one event loop
on a daemon thread, shared by the process, so synchronous hooks can call async helpers (post, the graders)."""
from __future__ import annotations

import asyncio
import threading


class AsyncLoopThread:
    """An event loop running forever on a daemon thread; ``run(coro)`` blocks until the coroutine is done."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="slime-like-async-loop", daemon=True)
        self._thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_LOOP: AsyncLoopThread | None = None
_LOCK = threading.Lock()


def get_async_loop() -> AsyncLoopThread:
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            _LOOP = AsyncLoopThread()
    return _LOOP


def run(coro):
    """Run a coroutine on the shared background loop and return its result (re-raises its exception)."""
    return get_async_loop().run(coro)

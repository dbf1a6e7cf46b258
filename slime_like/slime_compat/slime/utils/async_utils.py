"""slime.utils.async_utils: run a coroutine to completion from synchronous code (slime_like/utils/async_loop.py)."""
from slime_like.utils.async_loop import AsyncLoopThread, get_async_loop, run

__all__ = ["AsyncLoopThread", "get_async_loop", "run"]

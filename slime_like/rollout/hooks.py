"""Loading user functions named on the command line (slime_like/utils/user_functions.py does the work; the
trainer backends load theirs there too). slime's built-in functions named by their slime path resolve to
slime_like's own first (config/slime_paths.py)."""
from __future__ import annotations

from slime_like.config.slime_paths import resolve

from ..utils import user_functions
from ..utils.user_functions import call_maybe_async

__all__ = ["call_maybe_async", "load_function", "load_hook"]


def load_function(path: str, flag: str = "function path"):
    return user_functions.load_function(resolve(path), flag)


def load_hook(path: str, flag: str, signature: str, *positional: str, keywords: tuple = ()):
    return user_functions.load_hook(resolve(path), flag, signature, *positional, keywords=keywords)

"""Loading user functions named on the command line: see slime_like/utils/user_functions.py (the trainer
backends load theirs there too; this module keeps the rollout side's historical import path)."""
from __future__ import annotations

from ..utils.user_functions import call_maybe_async, load_function, load_hook

__all__ = ["call_maybe_async", "load_function", "load_hook"]

"""Loading user functions named on the command line (``--custom-rm-path pkg.mod.func``, the slime hooks).

Errors name the flag, the value, and what was found instead (did-you-mean for typos); ``load_hook`` also
checks that the function accepts the arguments slime passes, so a wrong signature fails at start-up with
the expected one, not in the middle of a run.
"""
from __future__ import annotations

import difflib
import importlib
import inspect

from .slime_names import install as install_slime_names


def load_function(path: str, flag: str = "function path"):
    """Import ``module.sub.func`` and return the callable; clear errors for every way it can be wrong.
    (utils/ imports nothing above it: callers map slime's built-in paths with config.slime_paths.resolve.)"""
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"{flag} {path!r}: expected 'module.function' (e.g. my_pkg.rewards.score)")
    install_slime_names()      # user code may import slime.* (ours unless a real slime is installed)
    module_name, attr = path.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"{flag} {path!r}: cannot import module {module_name!r} ({exc}); "
                         f"is it on PYTHONPATH?") from exc
    if not hasattr(module, attr):
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f"; did you mean {', '.join(module_name + '.' + c for c in close)}?" if close else ""
        raise ValueError(f"{flag} {path!r}: module {module_name!r} has no attribute {attr!r}{hint}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ValueError(f"{flag} {path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def load_hook(path: str, flag: str, signature: str, *positional: str, keywords: tuple = ()):
    """``load_function`` + a check that the function can be called with these positional argument names
    (and keyword-only ones); ``signature`` is the expected form shown in the error."""
    fn = load_function(path, flag)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return fn
    try:
        sig.bind(*positional, **{k: k for k in keywords})
    except TypeError as exc:
        raise ValueError(f"{flag} {path!r}: {fn.__name__}{sig} cannot be called as {signature} ({exc})") from exc
    return fn


async def call_maybe_async(fn, *args, **kwargs):
    """Call a user hook that may be sync or async."""
    out = fn(*args, **kwargs)
    if inspect.isawaitable(out):
        out = await out
    return out

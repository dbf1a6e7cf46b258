"""slime's ``--rollout-sample-hook-path`` (repeatable): ``hook(args, sample, **kwargs) -> Sample | None``,
sync or async, called on every generated sample before its reward, in the order given.

A hook may edit the sample in place (return None) or return a Sample that replaces it. Keyword arguments
slime passes, each only if the hook's signature names it (or takes ``**kwargs``): ``rollout_id`` (None in
evaluation here) and ``evaluation`` (bool). Applied to training and evaluation samples alike, as in slime.
"""
from __future__ import annotations

import inspect

from ..sample import Sample
from .hooks import call_maybe_async, load_function

FLAG = "--rollout-sample-hook-path"


def sample_hooks(args) -> list:
    """The loaded hooks, signature-checked: each must accept (args, sample) plus the keywords it names."""
    hooks = []
    for path in args.rollout_sample_hook_path:
        fn = load_function(path, FLAG)
        try:
            inspect.signature(fn).bind("args", "sample", **_accepted(fn, {"rollout_id": 0, "evaluation": False}))
        except TypeError as exc:
            raise ValueError(f"{FLAG} {path!r}: {fn.__name__}{inspect.signature(fn)} cannot be called as "
                             f"hook(args, sample[, rollout_id=..., evaluation=...]) ({exc})") from exc
        hooks.append(fn)
    return hooks


def _accepted(fn, kwargs: dict) -> dict:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params}
    return {k: v for k, v in kwargs.items() if k in names}


async def apply_sample_hooks(args, sample: Sample, hooks: list, **kwargs) -> Sample:
    for fn in hooks:
        out = await call_maybe_async(fn, args, sample, **_accepted(fn, kwargs))
        if out is not None:
            if not isinstance(out, Sample):
                raise TypeError(f"{FLAG} {fn.__module__}.{fn.__name__} returned {type(out).__name__}; "
                                "expected a Sample or None")
            sample = out
    return sample

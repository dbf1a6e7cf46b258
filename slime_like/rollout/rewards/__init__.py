"""Reward functions (the "rm hub"): rule-based graders, a remote reward server, user functions.

Public API
----------
``compute_score(rm_type, response, label, metadata=None) -> float``
    Rule-based reward of one response. ``rm_type`` is one of ``RULE_TYPES`` or ``boxed_<type>``
    (grade only the content of the last ``\\boxed{}``). For ``dapo`` (whose reference returns a
    dict) this returns the dict's ``score``; ``rule_reward`` returns the raw value.
``async_rm(args, samples) -> list``
    Rewards of a list of samples as the rollout computes them (raw values: float or dict):
    ``--custom-rm-path`` if given, else ``--rm-type`` (a sample's ``metadata["rm_type"]`` overrides
    it, as in slime). With ``--group-rm`` and a custom function, ``samples`` is one prompt's group
    and the function is called once on the whole list.
``assign_rewards(args, samples)``
    ``async_rm`` + stores ``sample.reward``; a failing reward function raises ``RewardFunctionError``
    naming the prompt index and the exception.
``scalar_reward(args, reward) -> float``
    The training scalar: dict rewards are indexed with ``--reward-key``.

Custom functions (``--custom-rm-path module.func``, sync or async), slime's signatures:
    per sample:            ``func(args, sample) -> float | dict``
    per group (--group-rm): ``func(args, samples: list[Sample]) -> list[float | dict]``
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import numbers
import random
from math import isfinite   # not `import math`: the .math grader submodule takes that name here

from ...sample import Status
from ..hooks import call_maybe_async, load_function
from .boxed import last_boxed_content
from .dapo import dapo_reward, dapo_score_prediction
from .deepscaler import deepscaler_reward, grade_answer
from .f1 import f1_reward
from .gpqa import gpqa_reward
from .math import math_reward
from .remote import RemoteRewardError, remote_rm
from slime_like.config.rewards import ALL_TYPES, IFBENCH_REFUSAL, RULE_TYPES  # the names, and the start-up check's

logger = logging.getLogger(__name__)

# slime's ifbench grader clones github.com/allenai/IFBench at run time and imports its instruction checkers
# (not a PyPI package; no data or code of it can ship here, and slime_like downloads nothing while running).


class RewardFunctionError(RuntimeError):
    pass


def _check_type(rm_type: str) -> None:
    import difflib

    base = rm_type[len("boxed_"):] if rm_type.startswith("boxed_") else rm_type
    if base == "ifbench":
        raise ValueError(IFBENCH_REFUSAL)
    if base not in ALL_TYPES:
        close = difflib.get_close_matches(base, ALL_TYPES, n=2)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"--rm-type {rm_type!r} is not a known reward type (known: {', '.join(ALL_TYPES)}, "
                         f"each optionally prefixed with 'boxed_'){hint}")


def rule_reward(rm_type: str, response: str, label, metadata: dict | None = None):
    """Raw rule-based reward (a dict for ``dapo``)."""
    if not rm_type:
        raise ValueError("no reward type: pass --rm-type (e.g. math) or --custom-rm-path module.func")
    _check_type(rm_type)
    if rm_type.startswith("boxed_"):
        return boxed_reward(rm_type[len("boxed_"):], response, label, metadata)
    if rm_type == "math":
        return math_reward(response, label)
    if rm_type == "deepscaler":
        return deepscaler_reward(response, label)
    if rm_type == "dapo":
        return dapo_reward(response, label)
    if rm_type == "f1":
        return f1_reward(response, label)
    if rm_type == "gpqa":
        return gpqa_reward(response, label, metadata=metadata)
    if rm_type == "random":
        return float(random.randint(0, 1))
    raise ValueError(f"--rm-type {rm_type}: needs a sample and args; use async_rm for it")


def boxed_reward(base: str, response: str, label, metadata: dict | None = None):
    """``boxed_<base>``: the answer is the content of the response's last ``\\boxed{}``, graded by <base>'s own
    answer comparison. slime strips the box and hands the bare content to the whole-response grader, which
    then cannot find an answer in it (``2+3i``, ``\\infty``, ``\\text{(B)}`` all score 0 there); here each
    grader is given the extracted answer in the form its comparison reads. No box -> the grader's failure value.
    """
    answer = last_boxed_content(response or "")
    if base == "random":
        return float(random.randint(0, 1))
    if base == "dapo":
        return dapo_score_prediction(answer if answer is not None else "[INVALID]", label)
    if answer is None:
        return 0.0
    if base == "math":          # math-verify finds a box first: re-box the answer it must read
        return math_reward("\\boxed{" + answer + "}", label)
    if base == "deepscaler":    # DeepScaleR's own step after it located the box (no thinking marker needed)
        return float(grade_answer(answer, label))
    if base == "f1":
        return f1_reward(answer, label)
    if base == "gpqa":
        return gpqa_reward(answer, label, metadata=metadata)
    raise ValueError(f"--rm-type boxed_{base}: not a rule-based grader (boxed_ applies to {', '.join(RULE_TYPES)})")


def compute_score(rm_type: str, response: str, label, metadata: dict | None = None) -> float:
    value = rule_reward(rm_type, response, label, metadata)
    if isinstance(value, dict):
        return float(value["score"])
    return float(value)


def scalar_reward(args, reward) -> float:
    if isinstance(reward, dict):
        key = args.reward_key
        if key is None:
            raise ValueError(f"the reward is a dict with keys {sorted(reward)}; pass --reward-key KEY "
                             f"(e.g. --reward-key score for dapo)")
        if key not in reward:
            raise KeyError(f"--reward-key {key!r} is not in the reward dict (keys: {sorted(reward)})")
        return float(reward[key])
    if reward is None:
        raise ValueError("sample has no reward yet")
    return float(reward)


async def _one(args, sample):
    """Built-in reward of one sample (--rm-type or metadata["rm_type"])."""
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = (metadata.get("rm_type") or args.rm_type or "").strip()
    if rm_type.startswith("boxed_") and rm_type[len("boxed_"):] == "remote_rm":
        rm_type = "remote_rm"
    if rm_type == "remote_rm":
        return await remote_rm(args, sample)
    return rule_reward(rm_type, sample.response, sample.label, metadata)


async def async_rm(args, samples: list) -> list:
    custom = args.custom_rm_path
    if custom and args.group_rm:
        out = await call_maybe_async(load_function(custom, "--custom-rm-path"), args, samples)
        out = list(out)
        if len(out) != len(samples):
            raise RewardFunctionError(f"--custom-rm-path {custom} with --group-rm returned {len(out)} rewards "
                                      f"for a group of {len(samples)} samples")
        return out
    if custom:
        return await _call_per_sample(load_function(custom, "--custom-rm-path"), args, samples)
    return list(await asyncio.gather(*(_one(args, s) for s in samples)))


async def _call_per_sample(fn, args, samples: list) -> list:
    """fn(args, sample) for each sample: a sync grader answers in place (no task per sample), awaitables
    (async graders) then run concurrently."""
    out = []
    try:
        for s in samples:
            out.append(fn(args, s))
    except BaseException:
        for o in out:                      # don't leave coroutines that were never awaited
            if inspect.iscoroutine(o):
                o.close()
        raise
    waiting = [i for i, o in enumerate(out) if inspect.isawaitable(o)]
    if waiting:
        for i, r in zip(waiting, await asyncio.gather(*(out[i] for i in waiting))):
            out[i] = r
    return out


async def assign_rewards(args, samples: list) -> None:
    """Score `samples` (one prompt's group, or any list) and store ``sample.reward``."""
    try:
        rewards = await async_rm(args, samples)
    except (RewardFunctionError, RemoteRewardError):
        raise
    except Exception as exc:
        idx = sorted({s.group_index for s in samples})
        where = (f"reward function failed on prompt index {idx[0] if len(idx) == 1 else idx} (--rm-type "
                 f"{args.rm_type}, --custom-rm-path {args.custom_rm_path}): {type(exc).__name__}: {exc}")
        if args.on_reward_error != "skip":
            raise RewardFunctionError(f"{where}; pass --on-reward-error skip to drop such prompts instead") from exc
        logger.warning("%s; --on-reward-error skip: the prompt's samples are dropped", where)
        for s in samples:   # FAILED: the rollout drops the group and counts it (rollout/reward_errors)
            s.status, s.reward = Status.FAILED, 0.0
            s.metadata = dict(s.metadata or {}, reward_error=f"{type(exc).__name__}: {str(exc)[:200]}")
        return
    for s, r in zip(samples, rewards):
        s.reward = check_reward(args, r, s)


def _reward_source(args, sample) -> str:
    custom = args.custom_rm_path
    if custom:
        return f"--custom-rm-path {custom}"
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    return f"--rm-type {metadata.get('rm_type') or args.rm_type}"


def _as_number(value):
    """A real number (bool, int, float, numpy / 0-d torch scalars) as float, else None."""
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        item = value.item()
        return float(item) if isinstance(item, numbers.Real) else None
    return None


FLOAT32_MAX = 3.4028234663852886e38   # rewards become float32 tensors: a larger one is inf there


def check_reward(args, reward, sample):
    """The reward as stored: a number or a dict of numbers; a non-number fails naming the function and value.
    A NaN/inf (or a number beyond float32's range, inf in the trainer) follows --on-nonfinite-reward: 'error'
    raises, 'zero' stores 0.0, 'skip' marks the sample FAILED so the rollout drops its group
    (metadata["nonfinite_reward"] keeps the value)."""
    where = f"{_reward_source(args, sample)} on prompt index {sample.group_index} (sample {sample.index})"
    key = args.reward_key
    if isinstance(reward, dict):
        items = {k: v for k, v in reward.items() if k == key or (key is None and isinstance(v, numbers.Real))}
    else:
        items = {None: reward}
    out = dict(reward) if isinstance(reward, dict) else reward
    for k, v in items.items():
        num = _as_number(v)
        label = f"reward[{k!r}]" if k is not None else "reward"
        if num is None:
            raise RewardFunctionError(f"{where} returned {label} = {v!r} ({type(v).__name__}); a reward must be a "
                                      f"number (or a dict with --reward-key)")
        if isfinite(num) and abs(num) <= FLOAT32_MAX:
            continue
        policy = args.on_nonfinite_reward
        if policy == "error":
            what = ("a non-finite reward" if not isfinite(num) else
                    "a reward beyond float32's range (+-3.4e38, the trainer's advantage arithmetic) is inf there, and")
            raise RewardFunctionError(f"{where} returned {label} = {num}: {what} would make the loss and "
                                      f"then every weight NaN. Fix the reward function, or pass "
                                      f"--on-nonfinite-reward skip (drop the prompt) / zero (count it as 0)")
        sample.metadata = dict(sample.metadata or {}, nonfinite_reward=repr(v))
        if policy == "skip":
            sample.status = Status.FAILED
        if isinstance(out, dict):
            out[k] = 0.0
        else:
            out = 0.0
    return out


__all__ = ["compute_score", "rule_reward", "async_rm", "assign_rewards", "scalar_reward", "RULE_TYPES",
           "ALL_TYPES", "RewardFunctionError", "RemoteRewardError", "remote_rm"]

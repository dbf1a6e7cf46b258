"""slime.rollout.rm_hub: the graders (slime_like/rollout/rewards). slime's per-sample ``async_rm(args, sample)`` and
``batched_async_rm(args, samples)`` over slime_like's ``async_rm(args, samples)`` (--custom-rm-path, --rm-type,
metadata["rm_type"], remote_rm, boxed_ prefixes); ifbench is refused there with the reason."""
from slime_like.rollout.rewards import async_rm as _async_rm, compute_score
from slime_like.rollout.rewards.deepscaler import deepscaler_reward as get_deepscaler_rule_based_reward
from slime_like.rollout.rewards.f1 import f1_with_pr as f1_score
from slime_like.rollout.rewards.gpqa import gpqa_reward as compute_gpqa_reward
from slime_like.rollout.rewards.remote import remote_rm

from .math_dapo_utils import compute_score as compute_score_dapo
from .math_utils import extract_answer as extract_boxed_answer, grade_answer_verl


async def async_rm(args, sample, **kwargs):
    """The reward of one sample, as the rollout computes it."""
    return (await _async_rm(args, [sample]))[0]


async def batched_async_rm(args, samples: list, **kwargs) -> list:
    """The rewards of several samples (a --custom-rm-path function is called as the rollout calls it)."""
    return await _async_rm(args, list(samples))


__all__ = ["async_rm", "batched_async_rm", "compute_gpqa_reward", "compute_score", "compute_score_dapo",
           "extract_boxed_answer", "f1_score", "get_deepscaler_rule_based_reward", "grade_answer_verl", "remote_rm"]

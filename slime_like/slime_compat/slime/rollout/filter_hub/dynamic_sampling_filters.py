"""slime.rollout.filter_hub.dynamic_sampling_filters: DAPO's dynamic sampling filter (slime_like/rollout/filters.py)."""
from slime_like.rollout.filters import check_reward_nonzero_std

__all__ = ["check_reward_nonzero_std"]

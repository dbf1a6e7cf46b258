"""slime.rollout.rm_hub.math_dapo_utils: DAPO's scorer (slime_like/rollout/rewards/dapo.py)."""
from slime_like.rollout.rewards.dapo import dapo_compute_score as compute_score, normalize_final_answer

__all__ = ["compute_score", "normalize_final_answer"]

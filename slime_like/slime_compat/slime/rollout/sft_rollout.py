"""slime.rollout.sft_rollout: slime_like's SFT rollout."""
from slime_like.rollout.sft_rollout import generate_rollout

__all__ = ["generate_rollout"]

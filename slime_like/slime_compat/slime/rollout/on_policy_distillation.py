"""slime.rollout.on_policy_distillation: slime_like's teacher-scoring reward and its post-processing."""
from slime_like.rollout.on_policy_distillation import post_process_rewards, reward_func

__all__ = ["post_process_rewards", "reward_func"]

"""slime.rollout.fully_async_rollout: slime_like's fully asynchronous rollout (run it with train_async.py)."""
from slime_like.rollout.fully_async import generate_rollout_fully_async

__all__ = ["generate_rollout_fully_async"]

"""slime.rollout.base_types: the rollout function's return types (slime_like/rollout/generate.py)."""
from slime_like.rollout.generate import RolloutFnEvalOutput, RolloutFnTrainOutput

__all__ = ["RolloutFnEvalOutput", "RolloutFnTrainOutput"]

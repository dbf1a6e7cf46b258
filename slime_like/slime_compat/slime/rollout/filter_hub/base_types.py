"""slime.rollout.filter_hub.base_types: a dynamic-sampling filter's answer (slime_like/rollout/filters.py)."""
from slime_like.rollout.filters import FilterDecision as DynamicFilterOutput

__all__ = ["DynamicFilterOutput"]

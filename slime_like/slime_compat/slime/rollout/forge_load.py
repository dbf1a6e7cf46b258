"""slime.rollout.forge_load: replaying saved rollouts as a rollout function."""
from slime_like.rollout.forge_load import generate_rollout

__all__ = ["generate_rollout"]

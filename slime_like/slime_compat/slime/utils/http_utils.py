"""slime.utils.http_utils: post / get (slime_like/rollout/engine_http.py: /generate of the run's engines goes
through the rollout's engine pool with the run's secret; other URLs are plain JSON requests)."""
from slime_like.rollout.engine_http import get, post

__all__ = ["get", "post"]

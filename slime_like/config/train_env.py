"""The environment of a trainer rank: slime's --train-env-vars and its torch thread count, one rule for the
preflight check and the Ray actors."""
from __future__ import annotations

import os


def train_env_vars(given) -> dict[str, str]:
    """--train-env-vars (its parsed JSON) as the actor's environment (slime merges them over its own defaults, as we
    do). Raises ValueError naming the flag for anything but a JSON object of names to strings, numbers or booleans."""
    given = given or {}
    if not isinstance(given, dict):
        raise ValueError(f"--train-env-vars {given!r}: expected a JSON object of variable names to values, "
                         "e.g. '{\"PYTORCH_CUDA_ALLOC_CONF\": \"expandable_segments:True\"}'")
    bad = [k for k, v in given.items() if not k or "=" in k or isinstance(v, (dict, list)) or v is None]
    if bad:
        raise ValueError(f"--train-env-vars: {', '.join(map(repr, bad))}: each entry must be NAME: value with a "
                         "non-empty NAME without '=' and a string, number or boolean value")
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in given.items()}


def trainer_threads(world: int, env: dict[str, str] | None = None) -> int:
    """torch intra-op threads per rank: OMP_NUM_THREADS from --train-env-vars (`env`), else from the user's
    environment (torchrun and our engines honour it too), else this host's cores shared among the `world` ranks.
    On CPU a second thread costs more CPU time than it saves wall time at small shapes (docs/benchmarks.md):
    that trade is the user's to make, so a value they set is never overridden."""
    source = "--train-env-vars" if env and "OMP_NUM_THREADS" in env else "the environment"
    given = ((env or {}).get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS", "")).strip()
    if not given:
        return max(1, (os.cpu_count() or 2) // world)
    if not given.isdigit() or int(given) < 1:
        raise ValueError(f"OMP_NUM_THREADS={given!r} in {source}: it sets each trainer rank's torch threads and "
                         "must be a positive integer (e.g. OMP_NUM_THREADS=1); or unset it to share the cores")
    return int(given)

"""The block every finished run ends with: what ran, how long, where its outputs are, what it achieved.

    [slime_like] run finished: 160 rollouts (0-159) in 5 min 12 s
      metrics     : runs/demo/metrics.jsonl
      curve       : runs/demo/learning_curve.png
      checkpoints : none (no --save)
      config      : runs/demo/config.yaml (slime_like 0.3.0.dev0)
      eval/arith/accuracy : 0.150 (before the first update) -> 0.463 (mean of the last 3 evals, 3.09x)
      train reward: 0.062 (rollout 0) -> 0.412 (mean of the last 3 rollouts)

The learning curve is drawn when matplotlib is installed (the `plot` / `all` extras); otherwise the line says how.
"""
from __future__ import annotations

import importlib.util
import json
import os

from slime_like import __version__
from slime_like.utils.metrics import METRICS_FILE, read_metrics
from slime_like.utils.run_outcome import TAIL, eval_change

REWARD_KEYS = ("rollout/reward", "rollout/reward_mean", "rollout/raw_reward")


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m} min" if hours else (f"{m} min {s} s" if m else f"{s} s")


def _curve(run_dir: str) -> str:
    if importlib.util.find_spec("matplotlib") is None:
        return (f'not drawn (matplotlib is not installed: pip install "slime_like[plot]", then '
                f'slime-like plot {run_dir})')
    from slime_like.utils.plot import plot_learning_curve

    try:
        return plot_learning_curve(run_dir)
    except ValueError as e:  # no reward and no eval metric: nothing to draw
        return f"not drawn ({e})"


def _checkpoints(args) -> str:
    if not args.save:
        return "none (no --save)"
    try:
        with open(os.path.join(args.save, "latest_run_iteration.json")) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return f"none written to {args.save} (--save-interval {args.save_interval})"
    roles = ", ".join(f"{role} {path}" for role, path in sorted(marker.get("roles", {}).items()))
    return f"{roles or args.save} (latest: rollout {marker.get('iteration')})"


def _reward_line(records: list) -> str | None:
    key = next((k for k in REWARD_KEYS if any(r.get(k) is not None for r in records)), None)
    points = [(r["rollout_id"], r[key]) for r in records if key and r.get(key) is not None]
    if len(points) < 2:
        return None
    tail = [v for _, v in points[-TAIL:]]
    return (f"train reward: {points[0][1]:.3f} (rollout {points[0][0]}) -> {sum(tail) / len(tail):.3f} "
            f"(mean of the last {len(tail)} rollouts)")


def summary_block(args, first_rollout: int, seconds: float) -> str:
    """The block for a run that trained rollouts first_rollout .. args.num_rollout - 1 in `seconds`."""
    run_dir = args.run_dir
    done = args.num_rollout - first_rollout
    span = f" ({first_rollout}-{args.num_rollout - 1})" if done > 1 else ""
    lines = [f"[slime_like] run finished: {done} rollout{'s' if done != 1 else ''}{span} in {_duration(seconds)}",
             f"  metrics     : {os.path.join(run_dir, METRICS_FILE)}"]
    try:
        records = read_metrics(run_dir)
    except (OSError, ValueError) as e:
        return "\n".join([*lines, f"  (no summary of the metrics: {e})"])
    lines += [f"  curve       : {_curve(run_dir)}",
              f"  checkpoints : {_checkpoints(args)}",
              f"  config      : {os.path.join(run_dir, 'config.yaml')} (slime_like {__version__})"]
    change = eval_change(records)
    lines.append(f"  {change.key} : {change.describe()}" if change else "  eval        : none (no --eval-interval)")
    reward = _reward_line(records)
    if reward:
        lines.append(f"  {reward}")
    return "\n".join(lines)

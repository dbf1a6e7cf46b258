"""Optional rollout statistics slime logs on request: ``--log-multi-turn`` and ``--log-correct-samples``.

Both are computed on the rollout side from the scored samples (slime computes them in the trainer from the
same per-sample fields), and appear in the rollout's metrics next to ``rollout/reward``.

``--log-multi-turn`` (slime's names, under ``multi_turn/``):
  ``raw_response_length/response_length_{mean,max,min,clip_ratio}`` response tokens including tool /
  environment tokens; clip_ratio = share at ``--rollout-max-response-len`` or longer;
  ``wo_obs_response_length/response_length_{mean,max,min}`` only the trained tokens (loss mask 1);
  ``multi_turn_metric/round_number_{mean,max,min}`` when samples carry ``metadata["round_number"]``.
``--log-correct-samples`` (a sample is correct when its raw reward is 1, as in slime):
  ``correct/num_samples``; ``correct_length/p25 .. p100`` the share of correct responses whose length
  falls in each quarter of ``--rollout-max-response-len``; ``correct_entropy`` the mean over correct
  samples of the per-token mean of -log p (the engine's log-probs; slime uses the trainer's).
"""
from __future__ import annotations

import math

from .rewards import scalar_reward


def _stats(prefix: str, values: list) -> dict:
    return {f"{prefix}_mean": sum(values) / len(values), f"{prefix}_max": max(values), f"{prefix}_min": min(values)}


def multi_turn_metrics(args, samples) -> dict:
    if not samples:
        return {}
    raw = [s.response_length for s in samples]
    trained = [sum(s.loss_mask) for s in samples]
    out = _stats("multi_turn/raw_response_length/response_length", raw)
    limit = args.rollout_max_response_len
    out["multi_turn/raw_response_length/response_length_clip_ratio"] = (
        sum(r >= limit for r in raw) / len(raw) if limit else 0.0)
    out.update(_stats("multi_turn/wo_obs_response_length/response_length", trained))
    rounds = [s.metadata["round_number"] for s in samples
              if isinstance(s.metadata, dict) and "round_number" in s.metadata]
    if rounds:
        out.update(_stats("multi_turn/multi_turn_metric/round_number", rounds))
    return out


def correct_sample_metrics(args, samples) -> dict:
    correct = [s for s in samples if _raw_reward(args, s) == 1]
    out = {"correct/num_samples": len(correct)}
    if not correct:
        return out
    limit = args.rollout_max_response_len or max(s.response_length for s in correct)
    quarters = [0] * 4
    for s in correct:
        quarters[min(3, max(0, math.ceil(4 * s.response_length / limit) - 1))] += 1
    out.update({f"correct_length/p{25 * (i + 1)}": c / len(correct) for i, c in enumerate(quarters)})
    entropies = [-sum(s.rollout_log_probs) / len(s.rollout_log_probs) for s in correct if s.rollout_log_probs]
    if entropies:
        out["correct_entropy"] = sum(entropies) / len(entropies)
    return out


def _raw_reward(args, sample):
    try:
        return scalar_reward(args, sample.reward)
    except (ValueError, KeyError):
        return None

"""slime's CI checks on every optimizer step (``--ci-*``), run inside the trainer like slime's.

``--ci-test``: after each step,
  * ``train_rollout_logprob_abs_diff`` (trainer vs engine log-probs, when measured) must be
    <= ``--ci-train-rollout-logprob-abs-diff-threshold`` (slime's default 0.1);
  * unless ``--ci-disable-kl-checker``: the first step of every rollout must have ``approx_kl`` (slime's
    ``ppo_kl``: old minus new log-prob) < 1e-8 (the old policy is the current one), and the very first step
    of the run ``kl_loss`` < 1e-8 (the reference is the initial actor).
``--ci-save-grad-norm PATTERN`` / ``--ci-load-grad-norm PATTERN`` (``{role}``, ``{rollout_id}``,
``{step_id}`` substituted): write each step's grad norm, or compare with the one written by an earlier run
(``math.isclose`` with rel_tol = abs_tol = 0.01, as slime). Files are JSON numbers (slime writes torch.save
pickles; those are read with torch's restricted ``weights_only`` loader).
A failed check raises ``CICheckError`` naming the check, the values and the step.
"""
from __future__ import annotations

import math
import os

KL_TOLERANCE = 1e-8


class CICheckError(AssertionError):
    pass


def check_step(args, role: str, rollout_id: int, step_id: int, num_steps: int, metrics: dict, writer: bool):
    where = f"{role} rollout {rollout_id} step {step_id}"
    if args.ci_test:
        _check_logprob_gap(args, where, metrics)
        if not args.ci_disable_kl_checker:
            _check_kl(where, rollout_id * num_steps + step_id, step_id, metrics)
    pattern_save, pattern_load = args.ci_save_grad_norm, args.ci_load_grad_norm
    names = dict(role=role, rollout_id=rollout_id, step_id=step_id)
    if pattern_save and writer:
        from slime_like.utils.json_dump import write_json

        write_json(pattern_save.format(**names), float(metrics["grad_norm"]))
    elif pattern_load and not pattern_save:
        expected = _read_number(pattern_load.format(**names))
        got = float(metrics["grad_norm"])
        if not math.isclose(got, expected, rel_tol=0.01, abs_tol=0.01):
            raise CICheckError(f"--ci-load-grad-norm: {where}: grad norm {got} differs from the recorded {expected} "
                               f"({pattern_load.format(**names)}) by more than 1%")


def _check_logprob_gap(args, where: str, metrics: dict):
    gap = metrics.get("train_rollout_logprob_abs_diff")
    threshold = args.ci_train_rollout_logprob_abs_diff_threshold
    if gap is not None and not gap <= threshold:
        raise CICheckError(f"--ci-test: {where}: train_rollout_logprob_abs_diff {gap} > "
                           f"--ci-train-rollout-logprob-abs-diff-threshold {threshold}")


def _check_kl(where: str, global_step: int, step_id: int, metrics: dict):
    if step_id == 0 and "approx_kl" in metrics and "clipfrac" in metrics and not metrics["approx_kl"] < KL_TOLERANCE:
        raise CICheckError(f"--ci-test (KL checker): {where}: ppo_kl {metrics['approx_kl']} >= {KL_TOLERANCE} on the "
                           "first step after scoring (old and current policy must be the same weights); "
                           "--ci-disable-kl-checker turns this off")
    if global_step == 0 and "kl_loss" in metrics and not metrics["kl_loss"] < KL_TOLERANCE:
        raise CICheckError(f"--ci-test (KL checker): {where}: kl_loss {metrics['kl_loss']} >= {KL_TOLERANCE} on the "
                           "first step of the run (the reference must equal the initial actor)")


def _read_number(path: str) -> float:
    if not os.path.exists(path):
        raise CICheckError(f"--ci-load-grad-norm: {path} does not exist (write it with --ci-save-grad-norm first)")
    from slime_like.utils.json_dump import is_json_file, read_json

    if is_json_file(path) or open(path, "rb").read(1).isdigit():
        return float(read_json(path))
    import torch

    return float(torch.load(path, map_location="cpu", weights_only=True))

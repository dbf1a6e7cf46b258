"""Per-token KL estimators between the policy and the reference (Schulman, "Approximating KL").

With tokens sampled from the policy pi and log_ratio = logp - ref_logp = log(pi / pi_ref):

    k1          = log_ratio                                   unbiased for KL(pi || ref), can be < 0
    k2          = 0.5 * log_ratio^2                           >= 0, biased, low variance
    k3          = exp(-log_ratio) + log_ratio - 1             >= 0, unbiased ("k3", GRPO's KL)
    low_var_kl  = k3 with -log_ratio clamped to [-20, 20] and the result clamped to [-10, 10]

Selected by `--kl-loss-type` (the --use-kl-loss term) and used for the reward-side penalty
(`--kl-coef`). Per token, no reduction, no masking (the caller aggregates with the mask).
"""
from __future__ import annotations

import torch

from .registry import unknown_choice_error

__all__ = ["kl_k1", "kl_k2", "kl_k3", "kl_low_var", "kl_penalty"]


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = logp - ref_logp."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (logp - ref_logp)^2."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1.

    expm1 keeps it exactly >= 0 in floating point near log_ratio = 0 (exp(x) - 1 - x would
    round to tiny negatives).
    """
    d = ref_logp - logp
    return torch.expm1(d) - d


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """low_var_kl = clamp(k3(clamp(ref - logp, -20, 20)), -10, 10): k3 that cannot overflow."""
    d = torch.clamp(ref_logp - logp, min=-20.0, max=20.0)
    return torch.clamp(torch.expm1(d) - d, min=-10.0, max=10.0)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of `kind` in {k1, k2, k3, low_var_kl} (see the module docstring)."""
    if logp.shape != ref_logp.shape:
        raise ValueError(f"kl_penalty: logp has shape {tuple(logp.shape)} but ref_logp has "
                         f"{tuple(ref_logp.shape)}; they must match")
    return get_kl_estimator(kind)(logp, ref_logp)


KL_ESTIMATORS = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
    "low_var_kl": kl_low_var,
}


def get_kl_estimator(name: str):
    """The per-token KL function for `--kl-loss-type name`."""
    try:
        return KL_ESTIMATORS[name]
    except (KeyError, TypeError):
        raise unknown_choice_error("--kl-loss-type value", name, KL_ESTIMATORS) from None

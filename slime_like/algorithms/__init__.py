"""RL algorithms as pure torch functions: advantages, policy / value / KL / SFT losses, log-probs.

No args object, no globals, no I/O, nothing else of slime_like imported. Padded `[batch,
response_len]` tensors with a 0/1 loss `mask` unless stated. `--advantage-estimator` names a registered
`EstimatorSpec` (registry.py; the built-ins in estimators.py); `--kl-loss-type` a KL estimator (kl.py).
See docs/algorithms.md for every formula, the flags that select it, and how to add an estimator.
"""
from .advantages import discounted_returns, gae, group_advantages, opd_advantages, reinforce_baseline_advantages
from .estimators import (
    compute_advantages_and_returns,
    group_mean_subtracted_rewards,
    group_normalized_rewards,
    outcome_broadcast_estimator,
    ppo_gae_estimator,
    raw_rewards,
    reinforce_plus_plus_baseline_estimator,
    reinforce_plus_plus_estimator,
)
from .kl import KL_ESTIMATORS, get_kl_estimator, kl_k1, kl_k2, kl_k3, kl_low_var, kl_penalty
from .losses import (AGGREGATION_MODES, aggregate_loss, cispo_loss, importance_ratio_exceeds, opsm_mask, policy_loss,
                     sft_loss, step_token_weights, tis_weights, value_loss)
from .masked import masked_mean, masked_moments, masked_sum, masked_whiten, whiten_from_moments
from .registry import (
    EstimatorSpec,
    UnknownChoiceError,
    estimator_names,
    get_estimator,
    register_estimator,
    unknown_choice_error,
    unregister_estimator,
)

__all__ = [
    # advantages
    "group_advantages", "reinforce_baseline_advantages", "discounted_returns", "gae", "opd_advantages",
    "compute_advantages_and_returns", "group_normalized_rewards", "group_mean_subtracted_rewards", "raw_rewards",
    "outcome_broadcast_estimator", "reinforce_plus_plus_estimator", "reinforce_plus_plus_baseline_estimator",
    "ppo_gae_estimator",
    # masked reductions / whitening
    "masked_sum", "masked_mean", "masked_moments", "whiten_from_moments", "masked_whiten",
    # KL
    "kl_penalty", "kl_k1", "kl_k2", "kl_k3", "kl_low_var", "KL_ESTIMATORS", "get_kl_estimator",
    # losses
    "policy_loss", "cispo_loss", "opsm_mask", "tis_weights", "value_loss", "sft_loss", "aggregate_loss",
    "AGGREGATION_MODES",
    "step_token_weights", "importance_ratio_exceeds",
    # registries
    "EstimatorSpec", "register_estimator", "unregister_estimator", "get_estimator", "estimator_names",
    "UnknownChoiceError", "unknown_choice_error",
]

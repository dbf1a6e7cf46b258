"""RL algorithms as pure torch functions: advantages, policy / value / KL / SFT losses, log-probs.

No args object, no globals, no I/O, nothing else of slime_like imported. Padded `[batch,
response_len]` tensors with a 0/1 loss `mask` unless stated. The registries map flag values
(`--advantage-estimator`, `--kl-loss-type`, `--loss-type`) to these functions. See
docs/algorithms.md for every formula and the flags that select it.
"""
from .advantages import discounted_returns, gae, group_advantages, reinforce_baseline_advantages
from .estimators import (
    compute_advantages_and_returns,
    group_rewards_for_estimator,
    outcome_broadcast_estimator,
    ppo_gae_estimator,
    reinforce_plus_plus_baseline_estimator,
    reinforce_plus_plus_estimator,
)
from .kl import kl_k1, kl_k2, kl_k3, kl_low_var, kl_penalty
from .logprobs import entropy_from_logits, logprobs_from_logits
from .losses import (AGGREGATION_MODES, aggregate_loss, importance_ratio_exceeds, policy_loss, sft_loss,
                     step_token_weights, tis_weights, value_loss)
from .masked import masked_mean, masked_moments, masked_sum, masked_whiten, pad_ragged, whiten_from_moments
from .registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_FUNCTIONS,
    POLICY_LOSS_KIND,
    UnknownChoiceError,
    get_advantage_estimator,
    get_kl_estimator,
    get_loss_function,
    get_policy_loss_kind,
    unknown_choice_error,
)

__all__ = [
    # advantages
    "group_advantages", "reinforce_baseline_advantages", "discounted_returns", "gae",
    "compute_advantages_and_returns", "group_rewards_for_estimator",
    "outcome_broadcast_estimator", "reinforce_plus_plus_estimator", "reinforce_plus_plus_baseline_estimator",
    "ppo_gae_estimator",
    # masked reductions / whitening
    "masked_sum", "masked_mean", "masked_moments", "whiten_from_moments", "masked_whiten", "pad_ragged",
    # KL
    "kl_penalty", "kl_k1", "kl_k2", "kl_k3", "kl_low_var",
    # losses
    "policy_loss", "tis_weights", "value_loss", "sft_loss", "aggregate_loss", "AGGREGATION_MODES",
    "step_token_weights", "importance_ratio_exceeds",
    # log-probs
    "logprobs_from_logits", "entropy_from_logits",
    # registries
    "ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "LOSS_FUNCTIONS", "POLICY_LOSS_KIND", "UnknownChoiceError",
    "unknown_choice_error", "get_advantage_estimator", "get_kl_estimator", "get_loss_function",
    "get_policy_loss_kind",
]

"""Registries keyed by flag values: `--advantage-estimator`, `--kl-loss-type`, `--loss-type`.

    ADVANTAGE_ESTIMATORS[name]  -> fn(*, rewards, mask, values, kl, kl_coef, gamma, lam, whiten)
                                   returning (advantages, returns)   (see estimators.py)
    KL_ESTIMATORS[name]         -> fn(logp, ref_logp) -> per-token KL
    LOSS_FUNCTIONS[name]        -> policy_loss / sft_loss
    POLICY_LOSS_KIND[estimator] -> the `kind` of policy_loss that estimator trains with

A lookup with an unknown key raises `UnknownChoiceError` (a ValueError and a KeyError) naming
the flag, the value, the valid choices and the closest match.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable

from . import estimators, kl, losses

__all__ = [
    "UnknownChoiceError", "unknown_choice_error",
    "ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "LOSS_FUNCTIONS", "POLICY_LOSS_KIND",
    "get_advantage_estimator", "get_kl_estimator", "get_loss_function", "get_policy_loss_kind",
]


class UnknownChoiceError(ValueError, KeyError):
    """An unknown registry key. Subclasses both so `except ValueError` and `except KeyError` catch it."""

    def __str__(self) -> str:  # KeyError would repr() the message; show it plainly
        return str(self.args[0]) if self.args else ""


def unknown_choice_error(what: str, value, choices: Iterable[str]) -> UnknownChoiceError:
    choices = list(choices)
    close = difflib.get_close_matches(str(value), choices, n=2, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return UnknownChoiceError(f"unknown {what} {value!r}; valid choices: {', '.join(choices)}.{hint}")


ADVANTAGE_ESTIMATORS = {
    "grpo": estimators.outcome_broadcast_estimator,
    "gspo": estimators.outcome_broadcast_estimator,
    "reinforce_plus_plus": estimators.reinforce_plus_plus_estimator,
    "reinforce_plus_plus_baseline": estimators.reinforce_plus_plus_baseline_estimator,
    "ppo": estimators.ppo_gae_estimator,
}

# grpo, reinforce_plus_plus(_baseline) and ppo train with the token-level PPO surrogate; gspo with
# the sequence-level ratio.
POLICY_LOSS_KIND = {
    "grpo": "ppo",
    "gspo": "gspo",
    "reinforce_plus_plus": "ppo",
    "reinforce_plus_plus_baseline": "ppo",
    "ppo": "ppo",
}

KL_ESTIMATORS = {
    "k1": kl.kl_k1,
    "k2": kl.kl_k2,
    "k3": kl.kl_k3,
    "low_var_kl": kl.kl_low_var,
}

LOSS_FUNCTIONS = {
    "policy_loss": losses.policy_loss,
    "sft_loss": losses.sft_loss,
}


def _lookup(table: dict, flag: str, key):
    try:
        return table[key]
    except (KeyError, TypeError):
        raise unknown_choice_error(f"{flag} value", key, table) from None


def get_advantage_estimator(name: str):
    """The estimator function for `--advantage-estimator name`."""
    return _lookup(ADVANTAGE_ESTIMATORS, "--advantage-estimator", name)


def get_policy_loss_kind(name: str) -> str:
    """`policy_loss(kind=...)` for `--advantage-estimator name` ("gspo" for gspo, else "ppo")."""
    return _lookup(POLICY_LOSS_KIND, "--advantage-estimator", name)


def get_kl_estimator(name: str):
    """The per-token KL function for `--kl-loss-type name`."""
    return _lookup(KL_ESTIMATORS, "--kl-loss-type", name)


def get_loss_function(name: str):
    """The loss function for `--loss-type name`."""
    return _lookup(LOSS_FUNCTIONS, "--loss-type", name)

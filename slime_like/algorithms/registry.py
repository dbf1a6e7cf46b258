"""The `--advantage-estimator` registry of estimator specs, and the unknown-choice error of every registry.

    @register_estimator("grpo", group_step=..., policy_loss_kind="ppo")   # decorates the token step
    spec = get_estimator("grpo")          # EstimatorSpec: the steps and the traits the rest of the code asks about

This module imports nothing: `estimators.py` (and `kl.py`, for `--kl-loss-type`) import it, and the package's
__init__ imports them, so every built-in estimator is registered once the package is imported; no cycle. A lookup with an unknown key raises `UnknownChoiceError` (a ValueError
and a KeyError) naming the flag, the value, the valid choices and the closest match.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "UnknownChoiceError", "unknown_choice_error", "EstimatorSpec", "register_estimator", "get_estimator",
    "estimator_names",
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


@dataclass(frozen=True)
class EstimatorSpec:
    """Everything the rest of the code needs to know about one `--advantage-estimator`.

    group_step(rewards [N], group_size, *, normalize_std) -> [N] tensor: the rollout side, per prompt group
        (normalize_std: GRPO's std division, off with --disable-grpo-std-normalization)
    token_step(*, rewards, mask, values, kl, kl_coef, gamma, lam, whiten) -> (advantages, returns): the trainer
    policy_loss_kind: "ppo" (token-level ratio), "gspo" (sequence-level ratio) or "cispo" (clipped, detached
        importance weight times log-prob), see losses.policy_loss
    needs_critic: the token step reads the critic's values (the run trains a critic)
    uses_reward_kl: the token step subtracts kl_coef * KL(policy || reference) (--kl-coef); when False no
        reference model is built for --kl-coef and no reference forward pass is run
    whitens_returns: the advantages are the whitened returns (the trainer whitens over every DP rank)
    needs_normalize_advantages: the estimator is defined with batch-whitened advantages (REINFORCE++)
    normalizes_group_std: the group step divides by the group's std (meaningless for a group of one)
    """
    name: str
    token_step: Callable
    group_step: Callable
    policy_loss_kind: str = "ppo"
    needs_critic: bool = False
    uses_reward_kl: bool = False
    whitens_returns: bool = False
    needs_normalize_advantages: bool = False
    normalizes_group_std: bool = False


_ESTIMATORS: dict[str, EstimatorSpec] = {}
POLICY_LOSS_KINDS = ("ppo", "gspo", "cispo")


def register_estimator(name: str, *, group_step: Callable, **traits) -> Callable:
    """Decorator: register the decorated token step under `--advantage-estimator name` with its group step and
    traits (EstimatorSpec fields). A second registration of one name is an error, never a silent override."""
    if traits.get("policy_loss_kind", "ppo") not in POLICY_LOSS_KINDS:
        raise ValueError(f"estimator {name!r}: policy_loss_kind must be one of {POLICY_LOSS_KINDS}")

    def register(token_step: Callable) -> Callable:
        if name in _ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered "
                             f"(by {_ESTIMATORS[name].token_step.__module__}); pick another name")
        _ESTIMATORS[name] = EstimatorSpec(name=name, token_step=token_step, group_step=group_step, **traits)
        return token_step

    return register


def estimator_names() -> list[str]:
    return list(_ESTIMATORS)


def get_estimator(name: str) -> EstimatorSpec:
    """The spec of `--advantage-estimator name`."""
    try:
        return _ESTIMATORS[name]
    except (KeyError, TypeError):
        raise unknown_choice_error("--advantage-estimator value", name, _ESTIMATORS) from None

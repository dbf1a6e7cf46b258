"""The `--advantage-estimator` registry of estimator specs, and the unknown-choice error of every registry.

    @register_estimator("grpo", group_step=...)   # decorates the token step (traits: slime_like/registry.py)
    spec = get_estimator("grpo")          # EstimatorSpec: the steps and the traits the rest of the code asks about

This module imports only the ground-floor table slime_like/registry.py: `estimators.py` (and `kl.py`, for `--kl-loss-type`) import it, and the package's
__init__ imports them, so every built-in estimator is registered once the package is imported; no cycle. A lookup with an unknown key raises `UnknownChoiceError` (a ValueError
and a KeyError) naming the flag, the value, the valid choices and the closest match.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from slime_like.registry import ADVANTAGE_ESTIMATORS as TABLE

__all__ = [
    "UnknownChoiceError", "unknown_choice_error", "EstimatorSpec", "register_estimator", "get_estimator",
    "estimator_names", "unregister_estimator",
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

    Its traits are the estimator's entry of slime_like/registry.py (read, never copied, so the configuration
    layer and the trainers ask the same table):
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

    @property
    def policy_loss_kind(self) -> str:
        return TABLE.fact(self.name, "policy_loss_kind", "ppo")

    @property
    def needs_critic(self) -> bool:
        return TABLE.has(self.name, "needs_critic")

    @property
    def uses_reward_kl(self) -> bool:
        return TABLE.has(self.name, "uses_reward_kl")

    @property
    def whitens_returns(self) -> bool:
        return TABLE.has(self.name, "whitens_returns")

    @property
    def needs_normalize_advantages(self) -> bool:
        return TABLE.has(self.name, "needs_normalize_advantages")

    @property
    def normalizes_group_std(self) -> bool:
        return TABLE.has(self.name, "normalizes_group_std")


TRAITS = ("needs_critic", "uses_reward_kl", "whitens_returns", "needs_normalize_advantages", "normalizes_group_std")
_ESTIMATORS: dict[str, EstimatorSpec] = {}
POLICY_LOSS_KINDS = ("ppo", "gspo", "cispo")


def register_estimator(name: str, *, group_step: Callable, policy_loss_kind: str | None = None, validator=None,
                       **traits) -> Callable:
    """Decorator: register the decorated token step under `--advantage-estimator name` with its group step.

    A built-in's traits are its entry in slime_like/registry.py; a new name is added to that table here, with
    `traits` (TRAITS set to True), `policy_loss_kind` (default "ppo") and an optional `validator(args, report)`:
    from then on it is a valid --advantage-estimator choice. A second registration of one name is an error,
    never a silent override; so are traits given for a name the table already describes."""
    if policy_loss_kind is not None and policy_loss_kind not in POLICY_LOSS_KINDS:
        raise ValueError(f"estimator {name!r}: policy_loss_kind must be one of {POLICY_LOSS_KINDS}")
    unknown = set(traits) - set(TRAITS)
    if unknown:
        raise ValueError(f"estimator {name!r}: unknown trait(s) {sorted(unknown)}; traits: {', '.join(TRAITS)}")
    if name not in TABLE:
        TABLE.register(name, None, capabilities={k for k, v in traits.items() if v}, flag_group="algorithm (GRPO/PPO)",
                       validator=validator, policy_loss_kind=policy_loss_kind or "ppo")
    elif traits or policy_loss_kind is not None or validator is not None:
        raise ValueError(f"estimator {name!r}: its traits are slime_like/registry.py's entry; change them there")

    def register(token_step: Callable) -> Callable:
        if name in _ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered "
                             f"(by {_ESTIMATORS[name].token_step.__module__}); pick another name")
        _ESTIMATORS[name] = EstimatorSpec(name=name, token_step=token_step, group_step=group_step)
        return token_step

    return register


def unregister_estimator(name: str) -> None:
    """Remove an estimator added at run time (its steps and its table entry)."""
    _ESTIMATORS.pop(name, None)
    TABLE.unregister(name)


def estimator_names() -> list[str]:
    """The estimators with steps, in the table's order."""
    return [n for n in TABLE.names() if n in _ESTIMATORS]


def get_estimator(name: str) -> EstimatorSpec:
    """The spec of `--advantage-estimator name`."""
    try:
        return _ESTIMATORS[name]
    except (KeyError, TypeError):
        raise unknown_choice_error("--advantage-estimator value", name, _ESTIMATORS) from None

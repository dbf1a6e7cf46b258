"""The built-in `--advantage-estimator`s, each registered as one spec (registry.EstimatorSpec); their traits
(critic, reward-side KL, whitening, the policy loss kind) are their entries in slime_like/registry.py.

The rollout side applies the estimator's *group* step to the rewards (`spec.group_step`: GRPO / GSPO
normalise within the prompt's group, REINFORCE++-baseline subtracts the group mean, PPO / REINFORCE++ keep
the raw reward). The trainer then calls its *token* step (`spec.token_step`, or
`compute_advantages_and_returns(name, ...)`), which does, per estimator (kl = per-token KL of the policy
against the reference, already computed with `kl_penalty(..., --kl-loss-type)`):

    grpo, gspo                    A_t = r                         (broadcast over valid tokens)
                                  returns = A
    reinforce_plus_plus_baseline  A_t = r - kl_coef * kl_t        returns = A
    reinforce_plus_plus           r_t = -kl_coef * kl_t (+ r on the last valid token)
                                  returns = discounted_returns(r_t, gamma)
                                  A = masked_whiten(returns)      (whiten=False leaves it to the caller)
    ppo                           r_t = -kl_coef * kl_t (+ r on the last valid token)
                                  A, returns = gae(r_t, values, gamma, lam)

These follow slime's `compute_advantages_and_returns` (grpo/gspo ignore the reward-side KL;
REINFORCE++-baseline subtracts it per token; REINFORCE++ and PPO put the reward on the last
token of the response). Two deliberate differences: the "last token" is the last token with
loss_mask 1 (slime's PPO uses the response's last position, whose reward would be dropped if it
were a masked tool token), and REINFORCE++'s returns are whitened here as in OpenRLHF / verl
(slime whitens only under --normalize-advantages; whitening twice changes nothing but eps).
`--normalize-advantages` itself stays with the caller, which can whiten over all data-parallel
ranks with `masked_moments` + all_reduce + `whiten_from_moments`.
All outputs are 0 at masked positions (ppo's returns: advantages + values, see `gae`).
"""
from __future__ import annotations

import torch

from .advantages import discounted_returns, gae, group_advantages, reinforce_baseline_advantages
from .masked import masked_whiten
from .registry import get_estimator, register_estimator

__all__ = [
    "compute_advantages_and_returns",
    "group_normalized_rewards", "group_mean_subtracted_rewards", "raw_rewards",
    "outcome_broadcast_estimator",
    "reinforce_plus_plus_estimator",
    "reinforce_plus_plus_baseline_estimator",
    "ppo_gae_estimator",
]


# ------------------------------------------------------------------ group steps (rollout side)
def group_normalized_rewards(rewards, group_size: int, *, normalize_std: bool = True) -> torch.Tensor:
    """GRPO / GSPO: (r - group mean) / group std (std division off with normalize_std=False)."""
    return group_advantages(rewards, group_size, normalize_std=normalize_std)


def group_mean_subtracted_rewards(rewards, group_size: int, *, normalize_std: bool = True) -> torch.Tensor:
    """REINFORCE++-baseline: r - group mean (normalize_std does not apply)."""
    return reinforce_baseline_advantages(rewards, group_size)


def raw_rewards(rewards, group_size: int, *, normalize_std: bool = True) -> torch.Tensor:
    """PPO / REINFORCE++: the rewards as they are (as float)."""
    r = torch.as_tensor(rewards)
    return r if torch.is_floating_point(r) else r.to(torch.float32)


def _prepare(rewards, mask, values, kl, kl_coef, name):
    if mask.dim() != 2:
        raise ValueError(f"{name}: mask must be [batch, response_len], got shape {tuple(mask.shape)}")
    valid = mask.bool() if mask.dtype != torch.bool else mask
    ref = values if values is not None else kl if kl is not None else None
    dtype = ref.dtype if ref is not None else (mask.dtype if torch.is_floating_point(mask) else torch.float32)
    r = torch.as_tensor(rewards, dtype=dtype, device=mask.device).reshape(-1)
    if r.numel() != mask.shape[0]:
        raise ValueError(f"{name}: got {r.numel()} rewards for a batch of {mask.shape[0]} samples (mask rows)")
    for key, t in (("values", values), ("kl", kl)):
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name}: {key} has shape {tuple(t.shape)} but mask has {tuple(mask.shape)}")
    if kl is None and kl_coef != 0:
        raise ValueError(f"{name}: kl_coef={kl_coef} (--kl-coef) needs the per-token kl tensor; pass "
                         f"kl=kl_penalty(log_probs, ref_log_probs, kind) or set --kl-coef 0")
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    kl_term = torch.zeros(mask.shape, dtype=dtype, device=mask.device) if kl is None \
        else torch.where(valid, kl_coef * kl.to(dtype), zero)
    return valid, r, kl_term, zero


def _last_valid_one_hot(valid: torch.Tensor) -> torch.Tensor:
    """1 at the last valid position of each row (all 0 for a row with no valid token)."""
    positions = torch.arange(1, valid.shape[1] + 1, device=valid.device)
    last = (positions * valid).argmax(dim=1)
    one_hot = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    one_hot[torch.arange(valid.shape[0], device=valid.device), last] = True
    return one_hot & valid.any(dim=1, keepdim=True)


def _token_rewards(valid, r, kl_term, zero):
    """-kl_coef * kl on every valid token, plus the sample's reward on its last valid token."""
    return torch.where(_last_valid_one_hot(valid), r[:, None], zero) - kl_term


# ------------------------------------------------------------------ token steps (trainer side)
@register_estimator("cispo", group_step=group_normalized_rewards)
@register_estimator("gspo", group_step=group_normalized_rewards)
@register_estimator("grpo", group_step=group_normalized_rewards)
def outcome_broadcast_estimator(*, rewards, mask, values=None, kl=None, kl_coef=0.0, gamma=1.0, lam=1.0,
                                whiten=True):
    """grpo / gspo / cispo: the sample's (group-normalised) reward on each of its valid tokens; returns = advantages.

    The reward-side KL is not used (GRPO regularises with --use-kl-loss instead), as in slime.
    """
    valid, r, _, zero = _prepare(rewards, mask, values, None, 0.0, "grpo/gspo estimator")
    adv = torch.where(valid, r[:, None].expand(mask.shape), zero)
    return adv, adv.clone()


@register_estimator("reinforce_plus_plus_baseline", group_step=group_mean_subtracted_rewards)
def reinforce_plus_plus_baseline_estimator(*, rewards, mask, values=None, kl=None, kl_coef=0.0, gamma=1.0,
                                           lam=1.0, whiten=True):
    """reinforce_plus_plus_baseline: A_t = (r - group mean) - kl_coef * kl_t on valid tokens; returns = A."""
    valid, r, kl_term, zero = _prepare(rewards, mask, values, kl, kl_coef, "reinforce_plus_plus_baseline estimator")
    adv = torch.where(valid, r[:, None] - kl_term, zero)
    return adv, adv.clone()


@register_estimator("reinforce_plus_plus", group_step=raw_rewards)
def reinforce_plus_plus_estimator(*, rewards, mask, values=None, kl=None, kl_coef=0.0, gamma=1.0, lam=1.0,
                                  whiten=True):
    """reinforce_plus_plus: discounted returns of the KL-shaped token rewards; A = whitened returns."""
    valid, r, kl_term, zero = _prepare(rewards, mask, values, kl, kl_coef, "reinforce_plus_plus estimator")
    returns = discounted_returns(_token_rewards(valid, r, kl_term, zero), valid, gamma)
    adv = torch.where(valid, masked_whiten(returns, valid), zero) if whiten and valid.any() else returns.clone()
    return adv, returns


@register_estimator("ppo", group_step=raw_rewards)
def ppo_gae_estimator(*, rewards, mask, values=None, kl=None, kl_coef=0.0, gamma=1.0, lam=1.0, whiten=True):
    """ppo: GAE of the KL-shaped token rewards against the critic's values (no whitening here)."""
    if values is None:
        raise ValueError("ppo estimator: --advantage-estimator ppo needs the critic's per-token values "
                         "(values=...); run with --use-critic")
    valid, r, kl_term, zero = _prepare(rewards, mask, values, kl, kl_coef, "ppo estimator")
    return gae(_token_rewards(valid, r, kl_term, zero), values, valid, gamma, lam)


def compute_advantages_and_returns(estimator: str, *, rewards, mask: torch.Tensor, values: torch.Tensor | None = None,
                                   kl: torch.Tensor | None = None, kl_coef: float = 0.0, gamma: float = 1.0,
                                   lam: float = 1.0, whiten: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token `(advantages, returns)`, both `[B, T]`, for `--advantage-estimator estimator`.

    rewards: `[B]` per-sample scalars as the rollout side produced them (see the module docstring);
    mask: `[B, T]` loss mask; values: `[B, T]` critic values (ppo only); kl: `[B, T]` per-token KL
    against the reference (needed when kl_coef != 0); kl_coef: `--kl-coef`; gamma: `--gamma`;
    lam: `--lambd`; whiten: whiten REINFORCE++'s returns into its advantages (set False when the
    caller whitens across data-parallel ranks itself).
    """
    fn = get_estimator(estimator).token_step
    return fn(rewards=rewards, mask=mask, values=values, kl=kl, kl_coef=kl_coef, gamma=gamma, lam=lam, whiten=whiten)

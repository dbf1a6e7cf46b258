"""Advantage estimators as small pure functions (the style of verl's core_algos.py).

Outcome-level (one scalar per sample):
    group_advantages               GRPO / GSPO / Dr.GRPO group normalisation
    reinforce_baseline_advantages  REINFORCE++-baseline (subtract the group mean)
Token-level (padded [B, T] with a 0/1 mask):
    discounted_returns             REINFORCE++ returns
    gae                            PPO's generalised advantage estimation

Masked positions (padding, tool / environment tokens) are *transparent* in the token-level
recursions: they receive no reward, bootstrap nothing, and the recursion runs straight across
them from the next valid token to the previous valid one. For right padding this is the usual
"reset at padding"; for masked tokens in the middle of a multi-turn response it means the final
reward still reaches the earlier turns (the environment's tokens are not actions of the policy).
Outputs are 0 at masked positions, except `gae`'s returns which are advantages + values.
"""
from __future__ import annotations

import torch

__all__ = ["group_advantages", "reinforce_baseline_advantages", "discounted_returns", "gae"]


def _as_rewards(rewards, group_size: int, name: str) -> torch.Tensor:
    r = torch.as_tensor(rewards)
    if not torch.is_floating_point(r):
        r = r.to(torch.float32)
    if r.dim() != 1:
        raise ValueError(f"{name}: rewards must be 1-D (one scalar per sample), got shape {tuple(r.shape)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{name}: group_size must be a positive int (--n-samples-per-prompt), got {group_size!r}")
    if r.numel() % group_size != 0:
        raise ValueError(f"{name}: {r.numel()} rewards do not split into groups of {group_size} "
                         f"(--n-samples-per-prompt); the rollout must keep whole groups")
    return r


def group_advantages(rewards, group_size: int, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantage per sample, over consecutive groups of `group_size` samples.

        A_i = (r_i - mean_g) / (std_g + eps)     std_g: unbiased (torch.std default)
        A_i =  r_i - mean_g                      normalize_std=False (Dr.GRPO,
                                                 --disable-grpo-std-normalization)
    A group of one sample gets advantage 0 (there is nothing to compare it with).
    """
    r = _as_rewards(rewards, group_size, "group_advantages")
    if group_size == 1:
        return torch.zeros_like(r)
    g = r.view(-1, group_size)
    centered = g - g.mean(dim=1, keepdim=True)
    if normalize_std:
        centered = centered / (g.std(dim=1, keepdim=True) + eps)
    return centered.reshape(-1)


def reinforce_baseline_advantages(rewards, group_size: int) -> torch.Tensor:
    """REINFORCE++-baseline outcome advantage: A_i = r_i - mean_g (the group mean is the baseline).

    No std division here; the token-level whitening (`--normalize-advantages`) does the scaling.
    """
    r = _as_rewards(rewards, group_size, "reinforce_baseline_advantages")
    g = r.view(-1, group_size)
    return (g - g.mean(dim=1, keepdim=True)).reshape(-1)


def _check_token_inputs(name: str, mask: torch.Tensor, **tensors: torch.Tensor) -> torch.Tensor:
    if mask.dim() != 2:
        raise ValueError(f"{name}: mask must be [batch, response_len], got shape {tuple(mask.shape)}")
    for key, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(f"{name}: {key} has shape {tuple(t.shape)} but mask has {tuple(mask.shape)}; they must match")
    return mask.bool() if mask.dtype != torch.bool else mask


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++ return per valid token t, walking back over the valid tokens only:

        G_t = r_t + gamma * G_next(t)        next(t): the next valid token after t (G = 0 past the end)

    Rewards at masked positions are ignored and masked outputs are 0 (so the return is reset at
    padding and appending padding changes nothing).
    """
    valid = _check_token_inputs("discounted_returns", mask, token_rewards=token_rewards)
    zero = torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype, device=token_rewards.device)
    out = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        m = valid[:, t]
        candidate = token_rewards[:, t] + gamma * running
        running = torch.where(m, candidate, running)   # masked: carry the next valid token's return
        out[:, t] = torch.where(m, candidate, zero)
    return out


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the valid tokens of each row.

        delta_t = r_t + gamma * V_next(t) - V_t          V_next = 0 after the last valid token
        A_t     = delta_t + gamma * lam * A_next(t)
        returns = A + V

    `next(t)` is the next *valid* token, so a padded or masked position contributes no reward,
    and its value is never used for bootstrapping. Advantages are 0 at masked positions; no
    whitening here (that is `masked_whiten`, applied by the caller for --normalize-advantages).
    """
    valid = _check_token_inputs("gae", mask, token_rewards=token_rewards, values=values)
    zero = torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device)
    next_value = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype, device=token_rewards.device)
    next_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        m = valid[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m, a_t, zero)
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, a_t, next_adv)
    return adv, adv + values


def opd_advantages(advantages: torch.Tensor, student_logp: torch.Tensor, teacher_logp: torch.Tensor,
                   mask: torch.Tensor, coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """On-policy distillation (slime's --use-opd): the sampled reverse KL to a teacher, as a token penalty.

        d_t = log pi_student(a_t | h_t) - log pi_teacher(a_t | h_t)      a_t sampled by the student
        A'_t = A_t - coef * d_t

    d_t is the one-sample estimate of KL(student || teacher) at the visited prefix (it can be < 0 for one
    token; it is >= 0 in expectation). Returns (A', d); both 0 at masked positions. Applied after the
    estimator and before any whitening, as slime does, so it works with every estimator.
    """
    valid = _check_token_inputs("opd_advantages", mask, advantages=advantages, student_logp=student_logp,
                                teacher_logp=teacher_logp)
    zero = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    reverse_kl = torch.where(valid, student_logp - teacher_logp, zero)
    return torch.where(valid, advantages - coef * reverse_kl, zero), reverse_kl

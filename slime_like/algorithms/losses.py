"""Policy, value and SFT losses per token, plus the aggregation of per-token losses.

All losses return a per-token tensor that is 0 at masked positions; `aggregate_loss` turns it
into the scalar the optimizer sees (`--calculate-per-token-loss` picks mode "sum" and the
trainer divides by the global token count).
"""
from __future__ import annotations

import torch

from .masked import masked_mean, masked_sum

__all__ = ["policy_loss", "cispo_loss", "opsm_mask", "tis_weights", "value_loss", "aggregate_loss", "sft_loss",
           "AGGREGATION_MODES", "step_token_weights", "importance_ratio_exceeds"]

AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "sum")


def _check_same_shape(name: str, mask: torch.Tensor, **tensors: torch.Tensor) -> torch.Tensor:
    for key, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(f"{name}: {key} has shape {tuple(t.shape)} but mask has {tuple(mask.shape)}; they must match")
    return mask.bool() if mask.dtype != torch.bool else mask


def _zero_masked(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _sequence_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`[B]` mean of x over each row's valid entries (the default `seq_mean` of GSPO and OPSM)."""
    return masked_mean(x, valid, dim=-1)


def _gspo_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, valid: torch.Tensor,
                    seq_mean=_sequence_mean) -> torch.Tensor:
    """GSPO's sequence log-ratio on every token, with the gradient flowing per token (GSPO-token):

        log s_i     = mean over valid t of (logp_t - old_logp_t)
        log s_{i,t} = sg[log s_i] + logp_t - sg[logp_t]          (sg = stop-gradient)

    The value on every token of sequence i is log s_i; the gradient w.r.t. logp_t is that of
    s_i * log pi(y_t), as in the GSPO paper's GSPO-token objective (and verl). With one advantage
    per sequence (how grpo-style rewards arrive) it equals the gradient of the sequence-level
    objective -min(s_i A_i, clip(s_i) A_i) differentiated through the mean (slime's form); with
    per-token advantages it is deliberately not the derivative of the forward value. `seq_mean(x, valid)`: the
    per-sequence mean (context parallelism: over every rank's part of the sequence).
    """
    seq = seq_mean(_zero_masked((logp - old_logp).detach(), valid), valid)            # [B]
    return seq.unsqueeze(-1) + logp - logp.detach()


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                eps_clip: float, eps_clip_high: float | None = None, eps_clip_c: float | None = None,
                kind: str = "ppo", seq_mean=_sequence_mean) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (kind="ppo") or its sequence-level variant GSPO (kind="gspo"), per token.

        ratio   = exp(logp - old_logp)                (ppo: per token)
                = exp(mean_seq(logp - old_logp))      (gspo: one ratio per sequence, see _gspo_log_ratio)
        L_clip  = max(-A * ratio, -A * clamp(ratio, 1 - eps_clip, 1 + eps_clip_high))
        L       = min(L_clip, -A * eps_clip_c)  where A < 0   (dual clip, --eps-clip-c, must be > 1)
                = L_clip                        elsewhere

    `eps_clip_high` defaults to `eps_clip` (symmetric). The loss is 0 at masked positions.
    Metrics (detached scalars over valid tokens): `clipfrac` (share where the clipped branch is
    active), `clipfrac_dual` (share where the dual clip bound is active), `approx_kl`
    (mean of old_logp - logp), `ratio_max`, `ratio_mean`.
    """
    if kind == "cispo":
        return cispo_loss(logp, old_logp, advantages, mask, eps_clip, eps_clip_high)
    valid = _check_same_shape("policy_loss", mask, logp=logp, old_logp=old_logp, advantages=advantages)
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    if not (0 <= eps_clip < 1) or eps_clip_high < 0:
        raise ValueError(f"policy_loss: need 0 <= eps_clip < 1 and eps_clip_high >= 0 (--eps-clip, --eps-clip-high), "
                         f"got {eps_clip}, {eps_clip_high}")
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"policy_loss: the dual-clip bound --eps-clip-c must be > 1.0, got {eps_clip_c}")
    if kind == "ppo":
        log_ratio = logp - old_logp
    elif kind == "gspo":
        log_ratio = _gspo_log_ratio(logp, old_logp, valid, seq_mean)
    else:
        raise ValueError(f"policy_loss: unknown kind {kind!r}; valid choices: 'ppo', 'gspo', 'cispo' "
                         f"(GSPO / CISPO are selected by --advantage-estimator gspo / cispo)")

    # Padded slots may hold anything: zero their log-ratio so exp() cannot overflow into NaN grads.
    log_ratio = _zero_masked(log_ratio, valid)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    dual = torch.zeros_like(valid)
    if eps_clip_c is not None:
        loss_dual = -advantages * eps_clip_c
        dual = (advantages < 0) & (loss > loss_dual)
        loss = torch.where(advantages < 0, torch.minimum(loss, loss_dual), loss)
    loss = _zero_masked(loss, valid)
    return loss, _ratio_metrics(ratio, logp, old_logp, valid, clipped, dual)


def _ratio_metrics(ratio: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, valid: torch.Tensor,
                   clipped: torch.Tensor, dual: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        any_valid = bool(valid.any())
        return {
            "clipfrac": masked_mean(clipped.to(ratio.dtype), valid),
            "clipfrac_dual": masked_mean(dual.to(ratio.dtype), valid),
            "approx_kl": masked_mean((old_logp - logp).detach(), valid),
            "ratio_max": ratio.detach()[valid].max() if any_valid else ratio.new_zeros(()),
            "ratio_mean": masked_mean(ratio.detach(), valid),
        }


def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
               eps_clip: float, eps_clip_high: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585 eq. 4-5; slime's compute_cispo_loss, verl's compute_policy_loss_cispo):

        ratio = exp(logp - old_logp)
        L     = -sg(clamp(ratio, 1 - eps_clip, 1 + eps_clip_high)) * A * logp

    The importance weight is clipped under a stop-gradient and the gradient flows through logp, so a clipped token
    still contributes (PPO's clip zeroes it). Bounds as slime's (delta from 1, `eps_clip_high` defaults to
    `eps_clip`); eps_clip >= 1 disables the lower bound (the canonical single-sided CISPO). `clipfrac` is the share
    of valid tokens whose weight was clipped. The loss is 0 at masked positions.
    """
    valid = _check_same_shape("cispo_loss", mask, logp=logp, old_logp=old_logp, advantages=advantages)
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    if eps_clip < 0 or eps_clip_high < 0:
        raise ValueError(f"cispo_loss: need eps_clip >= 0 and eps_clip_high >= 0 (--eps-clip, --eps-clip-high), "
                         f"got {eps_clip}, {eps_clip_high}")
    ratio = torch.exp(_zero_masked((logp - old_logp).detach(), valid))
    weight = torch.clamp(ratio, min=1.0 - eps_clip, max=1.0 + eps_clip_high)
    loss = _zero_masked(-weight * advantages * logp, valid)
    return loss, _ratio_metrics(ratio, logp, old_logp, valid, weight != ratio, torch.zeros_like(valid))


def opsm_mask(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              delta: float, seq_mean=_sequence_mean) -> tuple[torch.Tensor, torch.Tensor]:
    """Off-policy sequence masking (--use-opsm, slime's compute_opsm_mask): drop the tokens of a sequence that
    has drifted off-policy and is being pushed down.

        kl_i   = mean over valid t of (old_logp_t - logp_t)          (the sequence's sample KL)
        keep_t = 0  where A_t < 0 and kl_i > delta,  else 1

    Returns (keep [B, T] float, detached, 0 at masked positions; the share of valid tokens dropped)."""
    valid = _check_same_shape("opsm_mask", mask, logp=logp, old_logp=old_logp, advantages=advantages)
    with torch.no_grad():
        seq_kl = seq_mean(_zero_masked(old_logp - logp, valid), valid)      # [B]
        drop = (advantages < 0) & (seq_kl.unsqueeze(-1) > delta) & valid
        keep = _zero_masked((~drop).to(logp.dtype), valid)
        return keep, masked_mean(drop.to(logp.dtype), valid)


def tis_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, clip_high: float,
                clip_low: float = 0.0) -> torch.Tensor:
    """Truncated importance-sampling weights for --use-tis (train / rollout engine mismatch).

        w = clamp(exp(old_logp - rollout_logp), clip_low, clip_high)     detached, 0 at masked tokens

    old_logp comes from the trainer's forward, rollout_logp from the engine that sampled the
    tokens; the trainer multiplies the per-token policy loss by w (`--tis-clip` is clip_high).
    """
    valid = _check_same_shape("tis_weights", mask, old_logp=old_logp, rollout_logp=rollout_logp)
    if not clip_high >= clip_low:
        raise ValueError(f"tis_weights: need clip_high >= clip_low (--tis-clip, --tis-clip-low), got {clip_high}, {clip_low}")
    log_ratio = _zero_masked((old_logp - rollout_logp).detach(), valid)
    w = torch.clamp(torch.exp(log_ratio), min=clip_low, max=clip_high)
    return _zero_masked(w, valid)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               value_clip: float | None, *, with_metrics: bool = False):
    """Clipped value loss per token (PPO critic), 0 at masked positions.

        v_clip = old_values + clamp(values - old_values, -value_clip, value_clip)
        L      = 0.5 * max((values - returns)^2, (v_clip - returns)^2)
    `value_clip=None` disables clipping (L = 0.5 (values - returns)^2). With `with_metrics=True`
    returns `(loss, {"value_clipfrac": ...})` (share of valid tokens where the clipped term wins).
    """
    valid = _check_same_shape("value_loss", mask, values=values, old_values=old_values, returns=returns)
    unclipped = (values - returns) ** 2
    if value_clip is None:
        loss, clipped = 0.5 * unclipped, torch.zeros_like(valid)
    else:
        if not value_clip > 0:
            raise ValueError(f"value_loss: value_clip (--value-clip) must be > 0 or None, got {value_clip}")
        v_clip = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
        clipped_sq = (v_clip - returns) ** 2
        loss, clipped = 0.5 * torch.maximum(unclipped, clipped_sq), clipped_sq > unclipped
    loss = _zero_masked(loss, valid)
    if not with_metrics:
        return loss
    return loss, {"value_clipfrac": masked_mean(clipped.to(values.dtype), valid).detach()}


def sft_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood per token for `--loss-type sft_loss`: L_t = -logp_t, 0 at masked tokens.

    Reduce with `aggregate_loss` (token-mean gives the usual mean NLL over the batch's tokens).
    """
    valid = _check_same_shape("sft_loss", mask, logp=logp)
    return _zero_masked(-logp, valid)


def aggregate_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a `[B, T]` per-token loss to a scalar over the valid tokens.

        token-mean           sum_bt m l / sum_bt m            (each token weighs the same)
        seq-mean-token-mean  mean_b [ sum_t m l / sum_t m ]   (each sequence weighs the same)
        seq-mean-token-sum   mean_b [ sum_t m l ]
        sum                  sum_bt m l                       (--calculate-per-token-loss: the trainer
                                                               divides by the global token count)
    The seq-mean modes average over sequences with at least one valid token; empty masks give 0.
    """
    valid = _check_same_shape("aggregate_loss", mask, per_token_loss=per_token_loss)
    if mode == "token-mean":
        return masked_mean(per_token_loss, valid)
    if mode == "sum":
        return masked_sum(per_token_loss, valid)
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        if per_token_loss.dim() != 2:
            raise ValueError(f"aggregate_loss: mode {mode!r} needs a [batch, response_len] loss, "
                             f"got shape {tuple(per_token_loss.shape)}")
        per_seq = (masked_mean if mode == "seq-mean-token-mean" else masked_sum)(per_token_loss, valid, dim=-1)
        return masked_mean(per_seq, valid.any(dim=-1))
    from .registry import unknown_choice_error
    raise unknown_choice_error("aggregation mode", mode, AGGREGATION_MODES)


def step_token_weights(mask: torch.Tensor, mode: str, step_tokens: float, step_seqs: float,
                       horizon: float | None = None, seq_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token weights `[n, R]` so that sum(w * l) over every micro-batch of a step is the step's aggregate.

        token-mean           w = 1 / step_tokens                 (every valid token of the step weighs the same)
        seq-mean-token-mean  w = 1 / (step_seqs * n_i)           (n_i = valid tokens of response i)
        seq-mean-token-sum   w = 1 / step_seqs
        seq-mean-token-sum-norm  w = 1 / (step_seqs * horizon)   (Dr. GRPO / verl / ROLL: token sums over a fixed
                                                               length, `horizon` = the maximum response length)
    `step_tokens` / `step_seqs` count the valid tokens / the responses with a valid token over the whole step
    (every micro-batch and data-parallel rank). Called with one micro-batch's counts instead, the same weights
    aggregate that micro-batch alone (RLinf's use_valid_token_scale: false). Masked positions weigh 0.
    `seq_tokens` `[n]`: each response's valid tokens where `mask` holds only part of it (context parallelism).
    """
    valid = mask.bool() if mask.dtype != torch.bool else mask
    w = valid.to(torch.float32)
    if mode == "token-mean":
        return w / max(float(step_tokens), 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = valid.sum(dim=-1, keepdim=True) if seq_tokens is None else seq_tokens.reshape(-1, 1)
        per_seq = per_seq.clamp(min=1).to(torch.float32)
        return w / per_seq / max(float(step_seqs), 1.0)
    if mode == "seq-mean-token-sum":
        return w / max(float(step_seqs), 1.0)
    if mode == "seq-mean-token-sum-norm":
        if not horizon or horizon <= 0:
            raise ValueError("step_token_weights: seq-mean-token-sum-norm needs the fixed horizon (max response length)")
        return w / max(float(step_seqs), 1.0) / float(horizon)
    from .registry import unknown_choice_error
    raise unknown_choice_error("loss aggregation mode", mode, STEP_AGGREGATION_MODES)


STEP_AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def importance_ratio_exceeds(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                             threshold: float | None) -> bool:
    """RLinf's early stop: True when the mean of exp(logp - old_logp) over the valid tokens exceeds `threshold`
    (the caller then drops this micro-batch's policy update). None or no valid token never stops."""
    valid = mask.bool() if mask.dtype != torch.bool else mask
    if threshold is None or not bool(valid.any()):
        return False
    ratio = torch.exp(_zero_masked((logp - old_logp).detach(), valid))
    return bool(masked_mean(ratio, valid) > threshold)

"""A rollout's advantages and returns: the trainers' shared advantage pass (RLTrainerBase.compute_advantages).

The estimator's token step (`EstimatorSpec.token_step`), or slime's --custom-advantage-function-path in its place;
then the on-policy distillation term (opd.py) and whitening, in slime's order. Whitening (--normalize-advantages,
and REINFORCE++'s built-in whitening of its returns) uses the moments of every valid token on every DP rank
(`dp_all_reduce`), so it equals whitening the whole rollout at once. Backend-neutral: CPU tensors in, per-sample
1-D tensors out.
"""
from __future__ import annotations

import torch

from slime_like import algorithms as alg
from slime_like.backends.training import data as D
from slime_like.backends.training.hooks import custom_advantages
from slime_like.backends.training.opd import apply_opd


def needed_fields(spec, kl_coef: float) -> tuple:
    """The batch fields the advantage pass reads: rewards, the KL pair with reward-side KL, critic values."""
    return ("rewards",) + (("log_probs", "ref_log_probs") if kl_coef else ()) \
        + (("values",) if spec.needs_critic else ())


def advantages_and_returns(args, spec, batch: dict, *, kl_coef: float, custom, dp_all_reduce) -> dict:
    """`advantages`, `returns` per sample. `custom`: the user's advantage function (or None); `dp_all_reduce`:
    sums a tensor over the data-parallel group (the whitening moments)."""
    lengths = [int(r) for r in batch["response_lengths"]]
    width = max(lengths)
    mask = D.pad_rows(batch["loss_masks"], width)
    pad = lambda key: D.pad_rows(batch[key], width) if key in batch else None  # noqa: E731
    if custom:  # slime: the user's function replaces the estimator (whitening below still applies)
        adv_rows, ret_rows = custom_advantages(custom, args, batch)
        adv, ret = D.pad_rows(adv_rows, width), D.pad_rows(ret_rows, width)
    else:
        kl = alg.kl_penalty(pad("log_probs"), pad("ref_log_probs"), args.kl_loss_type) \
            if kl_coef else None
        adv, ret = spec.token_step(
            rewards=torch.tensor([float(r) for r in batch["rewards"]]), mask=mask,
            values=pad("values") if spec.needs_critic else None, kl=kl, kl_coef=kl_coef,
            gamma=float(args.gamma), lam=float(args.lambd), whiten=False)
    if args.use_opd and args.opd_kl_mode == "sampled":  # after the estimator, before whitening (slime's order)
        adv = apply_opd(args, batch, adv, mask)
    if args.normalize_advantages or spec.whitens_returns:
        moments = alg.masked_moments(adv, mask)
        moments = dp_all_reduce(moments)
        adv = torch.where(mask > 0, alg.whiten_from_moments(adv, moments), torch.zeros(()))
    return {"advantages": D.unpad_rows(adv, lengths), "returns": D.unpad_rows(ret, lengths)}

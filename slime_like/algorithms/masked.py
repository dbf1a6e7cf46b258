"""Masked reductions and whitening over padded `[batch, response_len]` tensors.

`mask` is a 0/1 tensor (float or bool) of the same shape as the data: 1 marks a token that is
trained on, 0 marks padding or a tool / environment token. Every reduction here ignores the
0 entries completely, so garbage (even NaN) in a padded slot never leaks into a result.
"""
from __future__ import annotations

import torch

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_moments",
    "whiten_from_moments",
    "masked_whiten",
]


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask.bool() if mask.dtype != torch.bool else mask


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """sum(x * mask), with masked entries replaced by 0 first (so NaN padding is harmless)."""
    x = torch.where(_valid(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """sum(x * mask) / max(sum(mask), 1): 0 (not NaN) when nothing is valid."""
    count = _valid(mask).sum() if dim is None else _valid(mask).sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_moments(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sufficient statistics `[count, sum(x), sum(x^2)]` of the masked entries, in float64.

    One small tensor, so data-parallel ranks can `all_reduce(SUM)` it and then call
    `whiten_from_moments` to whiten with the statistics of the whole global batch.
    """
    valid = _valid(mask)
    x64 = torch.where(valid, x.detach().to(torch.float64), torch.zeros((), dtype=torch.float64, device=x.device))
    return torch.stack([valid.sum().to(torch.float64), x64.sum(), (x64 * x64).sum()])


def whiten_from_moments(x: torch.Tensor, moments: torch.Tensor, shift_mean: bool = True,
                        eps: float = 1e-8) -> torch.Tensor:
    """`(x - mean) * rsqrt(var + eps)` from `masked_moments` (possibly all-reduced).

    var is the unbiased (Bessel-corrected) variance `(sum(x^2) - n mean^2) / (n - 1)`; with a
    single valid entry the variance is undefined and taken as 0. With `shift_mean=False` the
    mean is added back (only the scale is normalised).
    """
    count, total, total_sq = moments.to(torch.float64).unbind()
    if count.item() < 1:
        raise ValueError("masked_whiten: the mask selects no entries (sum(mask) == 0); nothing to whiten — "
                         "check the loss masks of this batch")
    mean = total / count
    var = ((total_sq - count * mean * mean) / (count - 1)).clamp(min=0.0) if count.item() > 1 else total * 0.0
    scale = torch.rsqrt(var + eps)
    out = (x.to(torch.float64) - mean) * scale
    if not shift_mean:
        out = out + mean
    return out.to(x.dtype)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Advantage normalisation of `--normalize-advantages` over the masked entries.

        mean = sum(m x) / sum(m)
        var  = sum(m (x - mean)^2) / (sum(m) - 1)          (unbiased, Bessel-corrected)
        out  = (x - mean) * rsqrt(var + eps)   [+ mean if shift_mean is False]

    The formula is applied to every entry (masked entries get a value too, which callers
    ignore via the mask). Two-pass statistics in float64 for accuracy; raises if the mask is empty.
    """
    if x.shape != mask.shape:
        raise ValueError(f"masked_whiten: x has shape {tuple(x.shape)} but mask has {tuple(mask.shape)}; they must match")
    valid = _valid(mask)
    count = valid.sum()
    if count.item() < 1:
        raise ValueError("masked_whiten: the mask selects no entries (sum(mask) == 0); nothing to whiten — "
                         "check the loss masks of this batch")
    x64 = x.to(torch.float64)
    mean = masked_sum(x64, valid) / count
    if count.item() > 1:
        var = masked_sum((x64 - mean) ** 2, valid) / (count - 1)
    else:
        var = torch.zeros((), dtype=torch.float64, device=x.device)
    out = (x64 - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out.to(x.dtype)

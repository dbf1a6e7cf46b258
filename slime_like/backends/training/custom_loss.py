"""slime's loss hooks in the Megatron trainer: --loss-type custom_loss with --custom-loss-function-path, and
--custom-pg-loss-reducer-function-path (docs/guide.md "slime's hooks").

slime's units: a loss (or reduced policy loss) is a sum over the micro-batch's samples, and the step's objective
is the sum over its micro-batches and DP ranks divided by the step's sample count. `sum_of_sample_mean(x)` (what
the hooks receive or replace) reduces per-token values the way this run aggregates the policy loss
(--loss-agg-mode, token mean over the step by default) in those units, so `sum_of_sample_mean(per_token_loss)`
is exactly the built-in aggregation. `Step` carries the step-wide numbers the conversion needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from slime_like.backends.training.micro_batch import MicroBatch


@dataclass
class Step:
    """One optimizer step as the loss of one micro-batch sees it."""
    factor: float        # micro-batches on this rank x DP size (mcore divides by the first, DDP averages the second)
    samples: int         # samples in the step over every DP rank
    global_tokens: float # loss tokens in the step over every DP rank
    per_token: bool      # --calculate-per-token-loss: mcore itself divides by the step's token count


def _rows(t: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return [t[i, :n] for i, n in enumerate(lengths)]


def _padded(x: torch.Tensor, like: torch.Tensor, lengths: list[int], what: str) -> torch.Tensor:
    """x as `[n, R]`: already padded, or slime's flat concatenation of the responses' tokens."""
    if x.shape == like.shape:
        return x
    if x.dim() == 1 and x.numel() == sum(lengths):
        return _scatter(torch.zeros(like.shape, dtype=x.dtype, device=x.device), x, lengths)
    raise ValueError(f"{what}: expected per-token values shaped {tuple(like.shape)} (padded) or ({sum(lengths)},) "
                     f"(slime's concatenated responses), got {tuple(x.shape)}")


def _scatter(out: torch.Tensor, flat: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    rows, start = [], 0
    for i, n in enumerate(lengths):
        rows.append(torch.cat([flat[start:start + n], out[i, n:]]))
        start += n
    return torch.stack(rows)


def share_weights(mb: MicroBatch, scale: float, weights, step: Step) -> torch.Tensor:
    """Per-token weights w with sum over the whole step of w x l = the step's loss (our units, before mcore)."""
    if step.per_token:
        return mb.loss_mask
    if weights is not None:
        return weights.to(mb.loss_mask.dtype) / step.factor
    return mb.loss_mask * (scale / step.factor)


def sum_of_sample_mean_fn(mb: MicroBatch, w: torch.Tensor, step: Step, what: str):
    """slime's reducer for this micro-batch: per-token values -> a scalar in slime's units."""
    units = 1.0 if step.per_token else float(step.samples)

    def sum_of_sample_mean(x: torch.Tensor) -> torch.Tensor:
        return (_padded(x, w, mb.response_lengths, what) * w.to(x.dtype)).sum() * units

    return sum_of_sample_mean


def to_mcore(value: torch.Tensor, step: Step) -> torch.Tensor:
    """A slime-units micro-batch loss -> the value mcore's schedule expects from this micro-batch."""
    return value if step.per_token else value * (step.factor / step.samples)


def to_metric_sum(value: torch.Tensor, step: Step) -> torch.Tensor:
    """A slime-units micro-batch metric -> a token-sum, which the step's reduction divides by its token count."""
    value = torch.as_tensor(value, dtype=torch.float32).detach()
    return value if step.per_token else value * (step.global_tokens / step.samples)


def slime_batch(mb: MicroBatch, total_lengths: list[int]) -> dict:
    """The micro-batch as slime's loss functions see it: per-sample 1-D tensors over the response tokens."""
    lengths = mb.response_lengths
    batch = {"response_lengths": list(lengths), "total_lengths": list(total_lengths),
             "loss_masks": _rows(mb.loss_mask, lengths), "targets": _rows(mb.targets, lengths)}
    for key, value in mb.fields.items():
        batch[key] = _rows(value, lengths)
    return batch


def custom_loss(fn, args, logits: torch.Tensor, mb: MicroBatch, w: torch.Tensor, step: Step, total_lengths):
    """(slime-units loss, {metric: slime-units value}) of `fn(args, batch, logits, sum_of_sample_mean)`."""
    name = "--custom-loss-function-path"
    out = fn(args, slime_batch(mb, total_lengths), logits, sum_of_sample_mean_fn(mb, w, step, name))
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise TypeError(f"{name} must return (loss, metrics dict), got {type(out).__name__}")
    loss, metrics = out
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TypeError(f"{name} must return a scalar tensor loss (reduce it with sum_of_sample_mean), got "
                        f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
    return loss, metrics


def reduced_pg_loss(factory, args, pg: torch.Tensor, mb: MicroBatch, step: Step, total_lengths) -> torch.Tensor:
    """slime's --custom-pg-loss-reducer-function-path: factory(total_lengths, response_lengths, loss_masks,
    calculate_per_token_loss) -> reducer; reducer(pg_loss) on the concatenated responses -> slime-units scalar."""
    lengths = mb.response_lengths
    reducer = factory(list(total_lengths), list(lengths), _rows(mb.loss_mask, lengths), step.per_token)
    if not callable(reducer):
        raise TypeError(f"--custom-pg-loss-reducer-function-path must return a reducer function, got "
                        f"{type(reducer).__name__}")
    value = reducer(torch.cat(_rows(pg * mb.loss_mask, lengths)))
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        raise TypeError("--custom-pg-loss-reducer-function-path: the reducer must return a scalar tensor, got "
                        f"{type(value).__name__}")
    return value

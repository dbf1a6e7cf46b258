"""Per-token log-probabilities and entropies from logits, without a full-vocabulary copy.

With a ~150k vocabulary, `[tokens, V]` logits are the largest tensor of a training step. A
plain `log_softmax(logits).gather(...)` builds a second `[tokens, V]` tensor and autograd keeps
it alive until backward. Here both functions are custom autograd functions that work over
row chunks: the forward keeps only one chunk's temporaries at a time and saves just the logits
(which already exist) plus one scalar per row; the backward recomputes the softmax chunk by
chunk and writes straight into the gradient of the logits (the one unavoidable `[tokens, V]`).

Computation is in float32 at least (float64 stays float64), so bf16 logits give fp32 results.
"""
from __future__ import annotations

import torch

__all__ = ["logprobs_from_logits", "entropy_from_logits"]

# Rows per chunk: 1024 rows x 150k vocab x 4 bytes = ~600 MB of temporaries at most.
DEFAULT_CHUNK_ROWS = 1024


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _LogProbs(torch.autograd.Function):
    """logp[n] = x[n, label[n]] - logsumexp(x[n, :]),  x = logits / temperature.

    d logp[n] / d logits[n, j] = (1[j == label[n]] - softmax(x[n])[j]) / temperature
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_rows):
        cdt = _compute_dtype(logits.dtype)
        n = logits.shape[0]
        out = torch.empty(n, dtype=cdt, device=logits.device)
        lse = torch.empty(n, dtype=cdt, device=logits.device)
        for s in range(0, n, chunk_rows):
            x = logits[s:s + chunk_rows].to(cdt) / temperature
            lse[s:s + chunk_rows] = torch.logsumexp(x, dim=-1)
            out[s:s + chunk_rows] = x.gather(-1, labels[s:s + chunk_rows, None]).squeeze(-1) - lse[s:s + chunk_rows]
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        logits, labels, lse = ctx.saved_tensors
        t, chunk_rows = ctx.temperature, ctx.chunk_rows
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], chunk_rows):
            g = grad_out[s:s + chunk_rows, None]
            x = logits[s:s + chunk_rows].to(lse.dtype) / t
            chunk = torch.exp(x - lse[s:s + chunk_rows, None]).mul_(-g)     # -p * g
            chunk.scatter_add_(-1, labels[s:s + chunk_rows, None], g)        # + 1[label] * g
            grad[s:s + chunk_rows] = chunk.div_(t)
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    """H[n] = logsumexp(x[n]) - sum_j p[n, j] x[n, j],  p = softmax(x).

    dH[n] / dx[n, j] = -p[n, j] (x[n, j] - sum_k p[n, k] x[n, k])
    """

    @staticmethod
    def forward(ctx, logits, chunk_rows):
        cdt = _compute_dtype(logits.dtype)
        n = logits.shape[0]
        ent = torch.empty(n, dtype=cdt, device=logits.device)
        lse = torch.empty(n, dtype=cdt, device=logits.device)
        mean_x = torch.empty(n, dtype=cdt, device=logits.device)   # E_p[x]
        for s in range(0, n, chunk_rows):
            x = logits[s:s + chunk_rows].to(cdt)
            lse[s:s + chunk_rows] = torch.logsumexp(x, dim=-1)
            p = torch.exp(x - lse[s:s + chunk_rows, None])
            # where(): a -inf logit has p = 0 and must contribute 0, not 0 * -inf = NaN
            mean_x[s:s + chunk_rows] = torch.where(p > 0, p * x, 0.0).sum(-1)
            ent[s:s + chunk_rows] = lse[s:s + chunk_rows] - mean_x[s:s + chunk_rows]
        ctx.save_for_backward(logits, lse, mean_x)
        ctx.chunk_rows = chunk_rows
        return ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        logits, lse, mean_x = ctx.saved_tensors
        chunk_rows = ctx.chunk_rows
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], chunk_rows):
            x = logits[s:s + chunk_rows].to(lse.dtype)
            p = torch.exp(x - lse[s:s + chunk_rows, None])
            chunk = torch.where(p > 0, -p * (x - mean_x[s:s + chunk_rows, None]), 0.0)
            grad[s:s + chunk_rows] = chunk * grad_out[s:s + chunk_rows, None]
        return grad, None


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                         chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """log softmax(logits / temperature)[label], per token.

    logits: `[..., V]`; labels: `[...]` integer ids (the leading shapes must match).
    Returns `[...]` in float32 (float64 for float64 logits). Temperature must be > 0; the
    trainer passes `--rollout-temperature` so the log-probs match what the engine sampled from.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logprobs_from_logits: logits {tuple(logits.shape)} and labels {tuple(labels.shape)} "
                         f"must share the leading dims ([..., V] vs [...])")
    if not temperature > 0:
        raise ValueError(f"logprobs_from_logits: temperature must be > 0 (--rollout-temperature), got {temperature}")
    if labels.numel() and (labels.min() < 0 or labels.max() >= logits.shape[-1]):
        raise ValueError(f"logprobs_from_logits: label ids must be in [0, {logits.shape[-1]}), got range "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    lead = labels.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).long()
    return _LogProbs.apply(flat_logits, flat_labels, float(temperature), int(chunk_rows)).reshape(lead)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """Entropy of softmax(logits) per position: `[..., V] -> [...]`, numerically stable.

    H = logsumexp(x) - sum_j softmax(x)_j x_j (no log of a probability, so no log(0)).
    Divide the logits by the temperature first if the entropy of the sampling
    distribution is wanted.
    """
    lead = logits.shape[:-1]
    return _Entropy.apply(logits.reshape(-1, logits.shape[-1]), int(chunk_rows)).reshape(lead)

"""Causal attention over a THD row split by context parallelism, without TransformerEngine (CPU, or a GPU stack
without TE): all-gather of keys and values over the CP group, causal masks from the chunk offsets.

The row layout is backends/training/cp_layout.py's (Megatron's / slime's): `cu_seqlens` are the whole samples'
lengths, each a multiple of 2 x CP; this rank holds chunks r and 2 x CP - 1 - r of every sample, at the same
local offsets on every rank. Keys and values of all ranks are gathered (one all-gather per layer and direction,
CP x the local K / V in memory), each sample's whole K / V is put back in order, and this rank's queries attend
to the keys at positions <= their own (the positions of chunk r and of chunk 2 x CP - 1 - r). Exact, not an
approximation: the same scores and softmax as one rank attending over the whole sample. TransformerEngine's CP
attention (p2p ring, all-gather or a2a per --cp-comm-type) replaces this module whenever TE builds the spec.

gather_whole_samples serves the layers whose token mixing is a recurrence (the gated delta net, on TE and local
specs alike): the same all-gather and reordering, returning every sample whole and the indices of this rank's
tokens in it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


class _AllGatherFirstDim(torch.autograd.Function):
    """[t, ...] -> [cp, t, ...] over `group`; the backward sums every rank's gradient of this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        size = dist.get_world_size(group)
        out = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(out, x.contiguous(), group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)  # gloo has no reduce_scatter: all-reduce, keep this rank's slice
        return grad[dist.get_rank(ctx.group)], None


def cp_causal_attention(q, k, v, cu_seqlens, group, scale, enable_gqa):
    """q `[t, h, d]`, k / v `[t, hk, d]` of this rank's THD row; returns `[t, h, d]`."""
    cp_size, cp_rank = dist.get_world_size(group), dist.get_rank(group)
    t = q.shape[0]
    k_all = _AllGatherFirstDim.apply(k, group).reshape(cp_size * t, *k.shape[1:])
    v_all = _AllGatherFirstDim.apply(v, group).reshape(cp_size * t, *v.shape[1:])
    full = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    outputs, start = [], 0
    for length in full:
        chunk = length // (2 * cp_size)
        order = _whole_sample(chunk, cp_size, start, t, q.device)
        q_pos = torch.cat([torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk),
                           torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)])
        allowed = (torch.arange(length)[None, :] <= q_pos[:, None]).to(q.device)
        qs = q[start:start + 2 * chunk].transpose(0, 1)[None]     # [1, h, 2c, d]
        ks, vs = (x[order].transpose(0, 1)[None] for x in (k_all, v_all))  # [1, hk, L, d]
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, scale=scale, enable_gqa=enable_gqa)
        outputs.append(out[0].transpose(0, 1))
        start += 2 * chunk
    return torch.cat(outputs)


def _whole_sample(chunk: int, cp_size: int, local_start: int, row_length: int, device) -> torch.Tensor:
    """Indices into the gathered `[cp * t]` rows giving one sample's 2 x CP chunks in their natural order:
    chunk k < CP is rank k's first half, chunk k >= CP rank 2 x CP - 1 - k's second half."""
    pieces = []
    for k in range(2 * cp_size):
        rank, half = (k, 0) if k < cp_size else (2 * cp_size - 1 - k, 1)
        pieces.append(rank * row_length + local_start + half * chunk + torch.arange(chunk))
    return torch.cat(pieces).to(device)


def gather_whole_samples(x, cu_seqlens, group):
    """This CP rank's THD row `x [t, ...]` -> (`[T, ...]` every sample's tokens of all ranks in their natural order,
    the whole samples' lengths, `keep [t]`: where this rank's tokens sit in it, so `whole[keep]` is `x`).

    Autograd: the gradient reaching `x` is the sum over CP ranks of their gradients at this rank's tokens (each rank
    uses every token of a sample it holds chunks of), as one rank holding whole samples would get."""
    cp_size, cp_rank = dist.get_world_size(group), dist.get_rank(group)
    t = x.shape[0]
    gathered = _AllGatherFirstDim.apply(x, group).reshape(cp_size * t, *x.shape[1:])
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    order, keep, local_start, whole_start = [], [], 0, 0
    for length in lengths:
        chunk = length // (2 * cp_size)
        order.append(_whole_sample(chunk, cp_size, local_start, t, x.device))
        keep += [whole_start + torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk),
                 whole_start + torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)]
        local_start += 2 * chunk
        whole_start += length
    if local_start != t:
        raise ValueError(f"context parallelism: THD lengths {lengths} of whole samples do not cut this rank's row of "
                         f"{t} tokens into 2 x {cp_size} chunks per sample")
    return gathered[torch.cat(order)], lengths, torch.cat(keep).to(x.device)

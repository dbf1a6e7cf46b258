"""DeepSeek sparse attention's math in plain torch (DeepSeek-V3.2, GLM-5): the lightning indexer's scores, the top-k
keys per query, and multi-latent attention restricted to them (dense attention with a top-k mask).

Exactly transformers' computation (GlmMoeDsaIndexer / DeepseekV32Indexer and the masked eager attention):
  index[q, k] = sum_h w[q, h] * H^-1/2 * relu(scale_i * iq[q, h] . ik[k]),  scale_i = index_head_dim^-1/2
  keep[q]     = the index_topk keys k <= q with the highest index (all of them while q < index_topk)
  out[q]      = softmax over keep[q] of (Q[q] . K[k] * softmax_scale) applied to V.
The top-k takes ties in key order (a stable sort), so the same keys are chosen whatever row, padding or
context-parallel layout carries the sample (torch.topk breaks ties by its own memory layout); transformers' topk
agrees wherever the k-th and (k+1)-th scores differ, which the tests' random models ensure.

Samples are handled one at a time (keys of one sample in their natural order), queries in blocks so the
indexer's [queries, heads, keys] scores and the attention's mask and scores stay bounded: O(block x keys) memory,
never O(S^2); the choice is kept as [queries, index_topk] indices. Still dense work per block (every key scored),
not a sparse kernel: slime's TileLang indexer / sparse MLA kernels (FlashMLA) compute only the chosen keys.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK_ELEMENTS = 1 << 24  # [query block, index heads, keys] floats per block of the indexer's scores


@dataclass
class IndexerInputs:
    """One sample's indexer tensors: queries `[Lq, H, D]` (RoPE applied), their head weights `[Lq, H]` (already
    times H^-1/2), keys `[Lk, D]` (RoPE applied, in sample order)."""
    queries: torch.Tensor
    weights: torch.Tensor
    keys: torch.Tensor


def index_scores(ix: IndexerInputs, scale: float) -> torch.Tensor:
    """`[Lq, Lk]` fp32 index scores, in transformers' order of operations."""
    scores = torch.matmul(ix.queries.float(), ix.keys.float().t()) * scale  # [Lq, H, Lk]
    scores = F.relu(scores)
    return torch.matmul(ix.weights.float().unsqueeze(1), scores).squeeze(1)


def topk_indices(scores: torch.Tensor, allowed: torch.Tensor, topk: int) -> torch.Tensor:
    """`[Lq, k]` the `topk` allowed keys of highest score per query (ties: the earlier key); a query with fewer
    allowed keys also gets disallowed ones, which causal_keep drops."""
    masked = scores.masked_fill(~allowed, float("-inf"))
    k = min(topk, scores.shape[-1])
    return torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :k]


def causal_keep(indices: torch.Tensor, q_pos: torch.Tensor, keys: int) -> torch.Tensor:
    """`[Lq, keys]` bool mask of the chosen keys at or before each query's position."""
    keep = torch.zeros(indices.shape[0], keys, dtype=torch.bool, device=indices.device).scatter_(-1, indices, True)
    return keep & (torch.arange(keys, device=q_pos.device)[None, :] <= q_pos[:, None])


def select_keys(ix: IndexerInputs, q_pos: torch.Tensor, topk: int, scale: float) -> torch.Tensor:
    """`[Lq, k]` chosen key indices of one sample (causal: key position <= query position), query block by block;
    k indices per query, not an [Lq, Lk] mask, are what a shared-indexer layer keeps for reuse."""
    lq, heads, lk = ix.queries.shape[0], ix.queries.shape[1], ix.keys.shape[0]
    block = max(1, BLOCK_ELEMENTS // max(1, heads * lk))
    k_pos = torch.arange(lk, device=q_pos.device)
    out = []
    with torch.no_grad():  # the top-k is not differentiable; the indexer is frozen (backends/megatron/dsa.py)
        for s in range(0, lq, block):
            part = IndexerInputs(ix.queries[s:s + block], ix.weights[s:s + block], ix.keys)
            allowed = k_pos[None, :] <= q_pos[s:s + block, None]
            out.append(topk_indices(index_scores(part, scale), allowed, topk))
    return torch.cat(out) if out else torch.zeros(0, min(topk, lk), dtype=torch.long, device=q_pos.device)


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, q_pos: torch.Tensor,
                     softmax_scale: float) -> torch.Tensor:
    """q `[Lq, n, dq]`, k `[Lk, n, dq]`, v `[Lk, n, dv]`, chosen key `indices` `[Lq, k]` -> `[Lq, n, dv]`; query
    block by block, so the mask and the scores take O(block x Lk), never O(Lq x Lk)."""
    lk, heads = k.shape[0], q.shape[1]
    block = max(1, BLOCK_ELEMENTS // max(1, heads * lk))
    kt, vt = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    out = []
    for s in range(0, q.shape[0], block):
        keep = causal_keep(indices[s:s + block], q_pos[s:s + block], lk)
        part = F.scaled_dot_product_attention(q[s:s + block].transpose(0, 1)[None], kt, vt,
                                              attn_mask=keep[None, None], scale=softmax_scale)
        out.append(part[0].transpose(0, 1))
    return torch.cat(out)


@dataclass
class SampleRows:
    """Where one sample sits: `q_rows` index this rank's query rows, `q_pos` their positions in the sample,
    `k_rows` index the key rows (all ranks' rows under context parallelism) of positions 0 .. L-1 in order."""
    q_rows: torch.Tensor
    q_pos: torch.Tensor
    k_rows: torch.Tensor


def row_samples(lengths: list[int], offset: int, device) -> list[SampleRows]:
    """Samples laid one after another in a row starting at `offset` (a padded row: one sample; a packed row)."""
    out, start = [], offset
    for length in lengths:
        rows = torch.arange(start, start + length, device=device)
        out.append(SampleRows(rows, rows - start, rows))
        start += length
    return out


def zigzag_samples(cu_seqlens: list[int], cp_size: int, cp_rank: int, local_len: int, device) -> list[SampleRows]:
    """Megatron's load-balanced layout (backends/training/cp_layout.py): `cu_seqlens` are whole padded samples, this
    rank holds chunks r and 2CP-1-r of each, concatenated; key rows index the `[cp * local_len]` gathered rows."""
    out, local = [], 0
    for length in (b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])):
        chunk = length // (2 * cp_size)
        q_pos = torch.cat([torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk),
                           torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)])
        k_rows = []
        for piece in range(2 * cp_size):  # piece < CP: rank piece's first half; else rank 2CP-1-piece's second
            rank, half = (piece, 0) if piece < cp_size else (2 * cp_size - 1 - piece, 1)
            k_rows.append(rank * local_len + local + half * chunk + torch.arange(chunk))
        out.append(SampleRows(torch.arange(local, local + 2 * chunk, device=device), q_pos.to(device),
                              torch.cat(k_rows).to(device)))
        local += 2 * chunk
    return out


def allgather_samples(cu_seqlens: list[int], cp_size: int, cp_rank: int, local_len: int, device) -> list[SampleRows]:
    """slime's --allgather-cp layout: the packed stream (`cu_seqlens` over it) cut into CP contiguous pieces, this
    rank holding stream rows [r * local_len, (r + 1) * local_len); gathered rows are the stream itself."""
    lo, hi, out = cp_rank * local_len, (cp_rank + 1) * local_len, []
    for start, end in zip(cu_seqlens, cu_seqlens[1:]):
        first, last = max(start, lo), min(end, hi)
        if first >= last:
            continue  # no query of this sample here
        stream = torch.arange(first, last, device=device)
        out.append(SampleRows(stream - lo, stream - start, torch.arange(start, last, device=device)))
    return out

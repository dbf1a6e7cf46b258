"""Context parallelism's micro-batch layout: Megatron's load-balanced 2 x CP chunking of every sample.

With --context-parallel-size CP > 1 each sample of a micro-batch is padded to a multiple of 2 x CP tokens and cut
into 2 x CP equal chunks; CP rank r holds chunks r and 2 x CP - 1 - r (the early, cheap chunk with the late,
expensive one, so causal attention costs every rank the same). The rank's chunks of every sample are concatenated
into one packed row described by THD parameters whose cumulative lengths are the *whole* padded samples (what
TransformerEngine's CP attention, megatron-core's THD RoPE and our all-gather attention read), as slime's
get_batch / slice_with_cp build it.

The loss sees only the response tokens whose scoring logit sits in this rank's chunks: `cols` index them in the
local row and `response_index` says which response token each one is, so the per-token columns (loss mask,
advantages, old log-probs, ...) are gathered at the same tokens. Every other response token is another rank's;
the step's token counts and metric sums are all-reduced over CP with data parallelism, and whole log-probs are
gathered by CP all-reduce (gather_response_rows) where the rollout needs them.
"""
from __future__ import annotations

import torch


def chunk_positions(padded_length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Positions of a sample (padded to a multiple of 2 x cp_size) that CP rank `cp_rank` holds, in its order."""
    c = padded_length // (2 * cp_size)
    first = torch.arange(cp_rank * c, (cp_rank + 1) * c)
    second = torch.arange((2 * cp_size - 1 - cp_rank) * c, (2 * cp_size - cp_rank) * c)
    return torch.cat([first, second])


def padded_length(length: int, cp_size: int) -> int:
    multiple = 2 * cp_size
    return (length + multiple - 1) // multiple * multiple


def build_cp_micro_batch(pb, sample_ids: list[int], cp_size: int, cp_rank: int, *, row_multiple: int = 1,
                         field_keys: tuple = (), pad_id: int = 0):
    """This CP rank's MicroBatch of samples `sample_ids` of the PackedBatch `pb` (see the module docstring).
    `row_multiple`: the local row is padded to a multiple of it (TP x 2 under sequence parallelism), the padding
    being one more THD sequence of its own."""
    ids = torch.tensor(sample_ids, dtype=torch.long)
    lens, resps, gstarts = pb.tok_len[ids].tolist(), pb.resp_len[ids].tolist(), pb.tok_start[ids].tolist()
    tokens, positions, cols, index, full = [], [], [], [], []
    offset = 0
    for length, resp, gstart in zip(lens, resps, gstarts):
        full.append(padded_length(length, cp_size))
        pos = chunk_positions(full[-1], cp_size, cp_rank)
        inside = pos < length
        tokens.append(torch.where(inside, pb.tokens[gstart + pos.clamp(max=length - 1)], torch.full((), pad_id)))
        positions.append(pos)
        first_logit = length - resp - 1  # logit p scores response token p - first_logit
        scores = (pos >= first_logit) & (pos < length - 1)
        cols.append(offset + scores.nonzero().flatten())
        index.append(pos[scores] - first_logit)
        offset += len(pos)
    pad = (-offset) % row_multiple
    if pad:  # its own THD sequence (cp x pad tokens in whole-sample units), never attended by a sample
        tokens.append(torch.full((pad,), pad_id))
        positions.append(torch.arange(pad))
        full.append(pad * cp_size)
    return _micro_batch(pb, sample_ids, torch.cat(tokens), torch.cat(positions), full, cols, index, field_keys)


def build_allgather_cp_micro_batch(pb, sample_ids: list[int], cp_size: int, cp_rank: int, *, row_multiple: int = 1,
                                   field_keys: tuple = (), pad_id: int = 0):
    """slime's --allgather-cp layout (DeepSeek sparse attention models): the samples concatenated into one stream,
    padded to a multiple of CP x `row_multiple` (the padding its own THD sequence), cut into CP contiguous pieces;
    this rank holds piece r. THD lengths are the stream's samples (global), positions restart in every sample, and
    attention all-gathers keys and values (backends/megatron/dsa.py)."""
    ids = torch.tensor(sample_ids, dtype=torch.long)
    lens, resps, gstarts = pb.tok_len[ids].tolist(), pb.resp_len[ids].tolist(), pb.tok_start[ids].tolist()
    pad = (-sum(lens)) % (cp_size * row_multiple)
    tokens = torch.cat([pb.tokens[g:g + n] for g, n in zip(gstarts, lens)] + [torch.full((pad,), pad_id)])
    positions = torch.cat([torch.arange(n) for n in lens] + [torch.arange(pad)])
    piece = tokens.numel() // cp_size
    lo, hi = cp_rank * piece, (cp_rank + 1) * piece
    cols, index, stream = [], [], 0
    for length, resp in zip(lens, resps):
        first = stream + length - resp - 1  # stream row of the logit scoring response token 0
        start = max(first, lo)
        rows = torch.arange(start, max(start, min(first + resp, hi)))
        cols.append(rows - lo)
        index.append(rows - first)
        stream += length
    return _micro_batch(pb, sample_ids, tokens[lo:hi], positions[lo:hi], lens + ([pad] if pad else []), cols, index,
                        field_keys)


def _micro_batch(pb, sample_ids, tokens, positions, thd_lengths, cols, index, field_keys):
    """The MicroBatch of a CP rank's row: `cols[k]` its rows scoring response tokens `index[k]` of sample k."""
    from slime_like.backends.training.micro_batch import MicroBatch, packed_seq_params_for

    ids = torch.tensor(sample_ids, dtype=torch.long)
    resps = pb.resp_len[ids].tolist()
    n, width = len(sample_ids), max(1, max(len(c) for c in cols))
    count = torch.tensor([len(c) for c in cols])
    valid = (torch.arange(width)[None, :] < count[:, None]).float()
    col_t = torch.zeros(n, width, dtype=torch.long)
    idx_t = torch.zeros(n, width, dtype=torch.long)
    for k, (c, i) in enumerate(zip(cols, index)):
        col_t[k, :len(c)], idx_t[k, :len(i)] = c, i
    resp_t = pb.resp_len[ids]
    targets = pb.tokens[(pb.tok_start[ids] + pb.tok_len[ids] - resp_t)[:, None] + idx_t] * valid.long()
    loss_mask = pb.gathered("loss_masks", ids, idx_t, valid)
    fields = {key: pb.gathered(key, ids, idx_t, valid) for key in field_keys if key in pb.batch}
    return MicroBatch(sample_ids, tokens[None], positions[None], None, packed_seq_params_for(thd_lengths),
                      torch.zeros(n, width, dtype=torch.long), col_t, targets, valid, loss_mask, fields,
                      response_index=idx_t, full_response_lengths=[int(r) for r in resps])


def gather_response_rows(values: torch.Tensor, mb, group) -> torch.Tensor:
    """`[n, Rmax]` whole-response rows from this CP rank's `[n, M]` values of micro-batch `mb` (zeros where another
    rank scores the token), summed over the CP group: every rank gets every response's values."""
    import torch.distributed as dist

    lengths = mb.full_response_lengths
    out = torch.zeros(len(lengths), max(lengths), dtype=values.dtype, device=values.device)
    out.scatter_add_(1, mb.response_index, values * mb.valid.to(values.dtype))
    dist.all_reduce(out, group=group)
    return out

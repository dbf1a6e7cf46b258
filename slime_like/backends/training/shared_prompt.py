"""--shared-prompt-training (our own flag, not slime's): each GRPO group's prompt computed once per micro-batch.

GRPO samples every prompt n times, and the trainer would otherwise run the n identical prompts through forward and
backward n times. With causal attention the prompt positions never see a response, so their hidden states are the
same in every sample: a unit laid out as `[prompt (P tokens), response_1, ..., response_m]`, where response k attends
to the prompt and to its own earlier tokens only and its rotary positions run P, P+1, ... (as if it followed the
prompt directly), gives every sample's per-token log-probs exactly as m separate rows, and the backward sums the
prompt's gradient over the samples as m rows would: P + sum(R_k) tokens instead of m*P + sum(R_k) (the "Prefix
Grouper" idea for GRPO).

Which samples share a unit: a run of consecutive samples of the batch (the rollout keeps a group's n samples
together, rollout/batch.py) whose prompt token ids (tokens[:len - R]) are identical, byte for byte; a sample whose
prompt differs from its neighbours' (a multi-turn sample, another group) is a unit of its own, laid out exactly like
a packed sample. A micro-batch is one packed row of whole units (split into pieces only where a unit alone exceeds
--max-tokens-per-gpu), with:
- `attention_mask` `[1, 1, T, T]` (True = masked): a query sees keys of its own unit at or before it that are prompt
  tokens or tokens of its own response (the local / SDPA core attention's boolean mask);
- `position_ids` `[1, T]`: each token's position in its own sample, which the Megatron trainer gives to the rotary
  embedding per token (backends/megatron/shared_prompt.py) instead of the row index;
- `cols[k, 0]`: the prompt's last position (shared by the unit's samples, each with its own target), `cols[k, j]`
  (j >= 1): response token j - 1 of sample k.
"""
from __future__ import annotations

import torch

from slime_like.backends.training.micro_batch import (MicroBatch, check_token_budget, first_fit_decreasing,
                                                      fixed_micro_batches, multimodal_inputs, to_device)


def prompt_units(pb, indices: list[int]) -> list[list[int]]:
    """`indices` (batch order kept) as runs of consecutive samples with identical prompt token ids."""
    units: list[list[int]] = []
    last_key = None
    for i in indices:
        start, prompt = int(pb.tok_start[i]), int(pb.tok_len[i] - pb.resp_len[i])
        key = pb.tokens[start:start + prompt].numpy().tobytes()
        if units and key == last_key and units[-1][-1] == i - 1:
            units[-1].append(i)
        else:
            units.append([i])
        last_key = key
    return units


def unit_tokens(pb, unit: list[int]) -> int:
    """Tokens of a unit in the shared layout: its prompt once plus every response."""
    return int(pb.tok_len[unit[0]] - pb.resp_len[unit[0]]) + int(pb.resp_len[unit].sum())


def _fit(pb, unit: list[int], max_tokens: int) -> list[list[int]]:
    """A unit cut into consecutive pieces of at most `max_tokens` shared-layout tokens (a sample is never cut)."""
    pieces: list[list[int]] = []
    for i in unit:
        if pieces and unit_tokens(pb, pieces[-1] + [i]) <= max_tokens:
            pieces[-1].append(i)
        else:
            pieces.append([i])
    return pieces


def micro_batch_groups(pb, indices: list[int], *, micro_batch_size: int | None,
                       max_tokens: int | None) -> list[list[int]]:
    """The micro-batches' sample ids. Fixed size (`micro_batch_size`): consecutive samples in batch order, so a
    group whose n divides the size stays in one micro-batch. Token budget (`max_tokens`, --use-dynamic-batch-size):
    whole units (pieces of them beyond the budget) packed first-fit-decreasing by their shared-layout tokens."""
    if micro_batch_size is not None:
        return fixed_micro_batches(list(indices), micro_batch_size)
    check_token_budget(indices, pb.tok_len.tolist(), max_tokens)
    pieces = {p[0]: p for u in prompt_units(pb, indices) for p in _fit(pb, u, max_tokens)}  # by first sample
    bins = first_fit_decreasing(list(pieces), {i: unit_tokens(pb, p) for i, p in pieces.items()}, max_tokens)
    return sorted((sorted(s for i in b for s in pieces[i]) for b in bins), key=lambda b: b[0])


def _row_layout(pb, units: list[list[int]]):
    """The row of `units`, vectorised: per row token its source index in pb.tokens, its position, its unit and its
    owner (-1: a prompt token, else the sample's batch index); per sample (units' order) the row index of its first
    logit (its unit's last prompt token) and of its first response token. The first sample of a unit contributes
    its whole token run (prompt + response, contiguous in pb.tokens), every other sample its response only."""
    ids = torch.tensor([i for u in units for i in u], dtype=torch.long)
    first = torch.tensor([k == 0 for u in units for k in range(len(u))])
    unit = torch.repeat_interleave(torch.arange(len(units)), torch.tensor([len(u) for u in units]))
    prompt = pb.tok_len[ids] - pb.resp_len[ids]
    seg = torch.where(first, pb.tok_len[ids], pb.resp_len[ids])
    seg_start = torch.cumsum(seg, 0) - seg
    total = int(seg.sum())
    sample_of = torch.repeat_interleave(torch.arange(len(ids)), seg, output_size=total)
    inside = torch.arange(total) - seg_start[sample_of]
    skip = torch.where(first, 0, prompt)  # a later sample's tokens start after its (shared) prompt
    src = pb.tok_start[ids][sample_of] + skip[sample_of] + inside
    pos = skip[sample_of] + inside
    owner = torch.where(first[sample_of] & (inside < prompt[sample_of]), -1, ids[sample_of])
    unit_start = seg_start[first][unit]  # row index of each sample's unit
    return ids, src, pos, unit[sample_of], owner, unit_start + prompt - 1, seg_start + prompt - skip


def shared_prompt_mask(unit_of: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """`[1, 1, T, T]` boolean mask (True = masked): key k is open to query q when both are in one unit, k <= q, and
    k is a prompt token or a token of q's own response."""
    t = unit_of.numel()
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    allowed = causal & (unit_of[:, None] == unit_of[None, :]) & ((owner[None, :] == -1) |
                                                                 (owner[None, :] == owner[:, None]))
    return ~allowed[None, None]


def build_shared_micro_batch(pb, sample_ids: list[int], field_keys=(), device=None) -> MicroBatch:
    """Samples `sample_ids` of the PackedBatch as one shared-prompt row (the module docstring's layout); the output
    rows follow the order of the units in the row."""
    ids, src, pos, unit_of, owner, first_logit, resp_start = _row_layout(pb, prompt_units(pb, sample_ids))
    order = ids.tolist()
    resp_t = pb.resp_len[ids]
    n, rmax = len(order), int(resp_t.max())
    j = torch.arange(rmax)[None, :]
    valid = (j < resp_t[:, None]).float()
    step = j * valid.long()
    # token j scored from response position j - 1; token 0 from the prompt's last position (padding: token 0's)
    cols = torch.where(step > 0, resp_start[:, None] + step - 1, first_logit[:, None])
    targets = pb.tokens[(pb.tok_start[ids] + pb.tok_len[ids] - resp_t)[:, None] + step] * valid.long()
    mb = MicroBatch(order, pb.tokens[src][None], pos[None], shared_prompt_mask(unit_of, owner), None,
                    torch.zeros(n, rmax, dtype=torch.long), cols, targets, valid,
                    pb.padded("loss_masks", ids, rmax) * valid,
                    {key: pb.padded(key, ids, rmax) for key in field_keys if key in pb.batch},
                    multimodal_inputs(pb.batch, order), per_token_positions=True)
    return to_device(mb, device)

"""Core attention of megatron-core's local spec through torch's scaled_dot_product_attention (no TE).

mcore's local DotProductAttention computes attention unfused: baddbmm into a [b * heads, s, s] buffer,
a masked fp32 softmax (FusedScaleMaskSoftmax's torch path), dropout, bmm, and copies around each. torch's SDPA
does the same math in one call (flash / memory-efficient kernels on a GPU, a fused kernel on CPU) and takes
grouped-query heads without repeating keys and values.

A packed micro-batch (--use-dynamic-batch-size without TE) arrives with training/data.block_causal_mask: a
[1, 1, S, S] mask, causal inside each sample and closed across samples. Attending over the whole row with it
costs S^2 per head, k times the work of k samples of S / k tokens; this module reads the sample boundaries
off the mask once per micro-batch (every layer gets the same mask object) and runs causal SDPA per sample
(up to MAX_PER_SAMPLE_CALLS samples; beyond, one SDPA call with the mask).

A --shared-prompt-training row (backends/training/shared_prompt.py) is not block-causal (responses share their
group's prompt), but its mask opens nothing across groups: diagonal_blocks finds the groups and a row of at least
MIN_TOKENS_TO_SPLIT_GROUPS tokens runs one masked SDPA call per group (up to MAX_PER_SAMPLE_CALLS); a shorter row,
one masked call over the row.

Context parallelism (--context-parallel-size > 1) hands it a THD row of this CP rank's chunks
(backends/training/cp_layout.py) with packed THD parameters: attention then all-gathers keys and values over the
CP group (cp_attention.py). mcore's own DotProductAttention refuses CP > 1 in its constructor; this subclass
builds it as CP 1 (it needs no CP state) and keeps the real config.

Where the module cannot reproduce mcore's computation it defers to it: an attention bias, a learnable softmax offset, query-key layer scaling, and attention dropout while training
(its random mask would differ from mcore's RNG stream).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

# Per-sample calls cost one kernel launch each (forward and backward, every layer): a row of many short samples
# (the CPU demo packs ~110 samples of ~9 tokens: 7x the aten ops, though 2.2x less CPU time) takes one masked call.
MAX_PER_SAMPLE_CALLS = 16
# A shared-prompt row is split at its groups only when it is long enough for the attention work the split saves
# (S^2 -> S^2 / groups) to outweigh a call per group: measured on CPU, rows of 16 groups and ~300-460 tokens
# (bench_train_kernels.py demo / 100m) ran 2.9-3.4x the aten ops of one masked call for no gain in step time.
MIN_TOKENS_TO_SPLIT_GROUPS = 2048


def _read_once_per_mask(read):
    """`read(allowed)` over a `[1, 1, S, S]` boolean mask (True = masked; `allowed` is its inverse `[S, S]`), None
    for any other mask; remembered for the last mask seen, since every layer of a micro-batch gets the same mask
    object (one read per micro-batch)."""
    last: list = [None, None]

    @functools.wraps(read)
    def once(mask: torch.Tensor):
        if last[0] is not mask:
            square = mask.dim() == 4 and mask.shape[:2] == (1, 1) and mask.shape[2] == mask.shape[3]
            last[:] = [mask, read(~mask[0, 0]) if square and mask.dtype == torch.bool else None]
        return last[1]
    return once


@_read_once_per_mask
def segment_lengths(allowed: torch.Tensor) -> list[int] | None:
    """Sample lengths of a block-causal `[1, 1, S, S]` mask (True = masked), or None for any other mask.

    Row i of a block-causal mask opens exactly columns [start(i), i], with start constant inside a sample;
    the mask is recognised only if rebuilding it from those starts gives it back exactly."""
    from slime_like.backends.training.micro_batch import block_causal_mask

    start = allowed.int().argmax(dim=-1)  # first open column of each row
    s = allowed.shape[0]
    firsts = (start == torch.arange(s, device=allowed.device)).nonzero().flatten().tolist()
    bounds = firsts + [s]
    candidate = [b - a for a, b in zip(bounds, bounds[1:])]
    if firsts and firsts[0] == 0 and all(n > 0 for n in candidate) and \
            torch.equal(~block_causal_mask(candidate)[0, 0].to(allowed.device), allowed):
        return candidate
    return None


@_read_once_per_mask
def diagonal_blocks(allowed: torch.Tensor) -> list[int] | None:
    """Lengths of the diagonal blocks of a `[1, 1, S, S]` boolean mask (True = masked) that opens nothing across
    blocks (--shared-prompt-training's rows: one block per prompt group), or None for any other mask. Every row
    must open at least its own column. The blocks are the finest split: a boundary b where no row from b on opens a
    column before b and no row before b opens a column from b on."""
    s = allowed.shape[0]
    idx = torch.arange(s, device=allowed.device)
    if not bool(allowed[idx, idx].all()):
        return None
    first = allowed.int().argmax(dim=-1)
    last = s - 1 - allowed.flip(-1).int().argmax(dim=-1)
    min_after = first.flip(0).cummin(0).values.flip(0)  # earliest column opened by rows i..S-1
    max_before = torch.cat([last.new_full((1,), -1), last.cummax(0).values[:-1]])  # by rows 0..i-1
    bounds = ((min_after >= idx) & (max_before < idx)).nonzero().flatten().tolist() + [s]
    return [b - a for a, b in zip(bounds, bounds[1:])]


class SDPADotProductAttention(DotProductAttention):
    """DotProductAttention with the same inputs and outputs ([s, b, heads, dim] in, [s, b, hidden] out; THD rows of
    context parallelism: [t, heads, dim] in, [t, hidden] out)."""

    def __init__(self, config, *args, **kwargs):
        if config.context_parallel_size > 1:  # mcore asserts CP 1 here; the CP path below needs none of its state
            import copy

            local = copy.copy(config)
            local.context_parallel_size = 1
            super().__init__(local, *args, **kwargs)
            self.config = config
        else:
            super().__init__(config, *args, **kwargs)

    def _defers_to_mcore(self, attention_bias, packed_seq_params) -> bool:
        dropout = self.training and self.attention_dropout.p > 0
        return (packed_seq_params is not None or attention_bias is not None or self.softmax_offset is not None
                or bool(getattr(self.config, "apply_query_key_layer_scaling", False)) or dropout)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd" and attention_bias is None:
            return self._thd_context_parallel(query, key, value, packed_seq_params)
        if self._defers_to_mcore(attention_bias, packed_seq_params):
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [s, b, h, d] -> [b, h, s, d]
        gqa = q.shape[1] != k.shape[1]
        causal = (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal
        if attention_mask is None:
            context = self._sdpa(q, k, v, None, causal, gqa)
        else:
            lengths = segment_lengths(attention_mask)
            blocks = diagonal_blocks(attention_mask) if lengths is None else None
            split = blocks is not None and 1 < len(blocks) <= MAX_PER_SAMPLE_CALLS \
                and attention_mask.shape[-1] >= MIN_TOKENS_TO_SPLIT_GROUPS
            if split:  # one masked call per block
                context = self._blockwise(q, k, v, attention_mask, blocks, gqa)
            elif lengths is None or len(lengths) > MAX_PER_SAMPLE_CALLS:  # one masked call over the row
                context = self._sdpa(q, k, v, ~attention_mask, False, gqa)
            else:
                context = torch.cat([self._sdpa(qs, ks, vs, None, True, gqa) for qs, ks, vs in
                                     zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2))], dim=2)
        s, b = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(s, b, self.hidden_size_per_partition)

    def _blockwise(self, q, k, v, mask, blocks, gqa):
        """Attention within each diagonal block of a mask that opens nothing across blocks (diagonal_blocks)."""
        out, at = [], 0
        for n, qs, ks, vs in zip(blocks, q.split(blocks, 2), k.split(blocks, 2), v.split(blocks, 2)):
            out.append(self._sdpa(qs, ks, vs, ~mask[..., at:at + n, at:at + n], False, gqa))
            at += n
        return torch.cat(out, dim=2)

    def _thd_context_parallel(self, query, key, value, packed_seq_params):
        """A CP rank's THD row (cp_layout.py): all-gather attention over the CP group (cp_attention.py)."""
        from megatron.core import parallel_state as ps

        from slime_like.backends.megatron.cp_attention import cp_causal_attention

        if self.training and self.attention_dropout.p > 0:
            raise NotImplementedError("attention dropout with context parallelism needs TransformerEngine; "
                                      "use --attention-dropout 0")
        context = cp_causal_attention(query, key, value, packed_seq_params.cu_seqlens_q,
                                      ps.get_context_parallel_group(), self.softmax_scale,
                                      query.shape[1] != key.shape[1])
        return context.reshape(context.shape[0], self.hidden_size_per_partition)

    def _sdpa(self, q, k, v, mask, causal, gqa):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and q.shape[2] > 1,
                                              scale=self.softmax_scale, enable_gqa=gqa)


def use_sdpa_attention(spec):
    """Point every local-spec layer's core attention at SDPADotProductAttention (in place); returns spec.
    Only layers whose core attention is mcore's own DotProductAttention (MLA keeps its subclass)."""
    layers = getattr(spec, "layer_specs", None) or [spec]
    for layer in layers:
        submodules = getattr(getattr(layer.submodules, "self_attention", None), "submodules", None)
        if submodules is not None and getattr(submodules, "core_attention", None) is DotProductAttention:
            submodules.core_attention = SDPADotProductAttention
    return spec

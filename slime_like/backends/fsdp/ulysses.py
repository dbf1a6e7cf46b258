"""Ulysses sequence parallelism for the FSDP trainer (`--context-parallel-size N` with `--train-backend fsdp`).

The ranks of one sequence-parallel (SP) group share a data-parallel rank's micro-batches. Inside the model's decoder
body each rank runs its 1/N of the sequence positions (rows right-padded to a multiple of N): embeddings, norms, MLPs
and the attention projections see only the shard. Attention is the one place that needs every position: an
all-to-all turns this rank's `[b, heads, S/N, d]` queries, keys and values into `[b, heads/N, S, d]` (the whole
sequence, a subset of the heads), causal SDPA runs over it, and a second all-to-all turns the output back into the
shard's `[b, S/N, heads, d]` (DeepSpeed-Ulysses; verl's `ulysses_sequence_parallel_size`, ROLL's `ulysses_size`).
Position ids are the global ones, so RoPE is applied to each shard as it would be to the whole sequence.

The body's last hidden states are all-gathered over the group before the output layer, so the head (lm_head or the
critic's value head), `logits_to_keep` and the loss see whole sequences exactly as without SP: every SP rank computes
the same loss. The gather's backward keeps this rank's slice of the gradient, times N: FSDP averages gradients over
all DP x SP ranks, while the N shards of a sequence each hold a part of its gradient that must be summed (the head's
gradient, computed whole on every SP rank, is averaged, as it should be).

Hooks: the attention function is registered in transformers' AttentionInterface (the model is loaded with
`attn_implementation=ATTENTION`; transformers then builds no mask for it: causal, right padding only), and the
decoder body gets a forward pre-hook (shard input_ids / position_ids) and a forward hook (gather the hidden states).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

ATTENTION = "slime_like_ulysses_sdpa"


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 (equal chunks): chunk j goes to rank j. Its own inverse, so also its backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()  # first: empty_like keeps a permuted tensor's strides, all_to_all_single writes densely
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


class _GatherSequence(torch.autograd.Function):
    """All-gather of `[b, s, h]` shards along dim 1; backward: this rank's slice of the gradient times the group size
    (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.rank, ctx.size, ctx.length = group, dist.get_rank(group), dist.get_world_size(group), x.shape[1]
        parts = [torch.empty_like(x) for _ in range(ctx.size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        mine = grad[:, ctx.rank * ctx.length:(ctx.rank + 1) * ctx.length]
        return mine * ctx.size, None


def _seq_to_heads(x, group, size):
    """`[b, H, s, d]` (this rank's positions, every head) -> `[b, H/N, N*s, d]` (every position, this rank's heads)."""
    b, h, s, d = x.shape
    chunks = x.reshape(b, size, h // size, s, d).permute(1, 0, 2, 3, 4)  # [N (head group), b, H/N, s, d]
    got = _AllToAll.apply(chunks, group)  # [N (position shard), b, H/N, s, d]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * s, d)


def _heads_to_seq(y, group, size):
    """Inverse of _seq_to_heads: `[b, H/N, N*s, d]` -> `[b, H, s, d]`."""
    b, hn, full, d = y.shape
    s = full // size
    chunks = y.reshape(b, hn, size, s, d).permute(2, 0, 1, 3, 4)  # [N (position shard), b, H/N, s, d]
    got = _AllToAll.apply(chunks, group)  # [N (head group), b, H/N, s, d]
    return got.permute(1, 0, 2, 3, 4).reshape(b, hn * size, s, d)


def make_attention(group):
    """The attention function of transformers' AttentionInterface for SP group `group`."""
    size = dist.get_world_size(group)

    def ulysses_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if attention_mask is not None or kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
            raise NotImplementedError("Ulysses sequence parallelism runs causal attention over right-padded rows only "
                                      "(no attention mask, sliding window or logit softcapping); "
                                      "use --context-parallel-size 1")
        heads, kv_heads = query.shape[1], key.shape[1]
        if kv_heads % size:  # too few KV heads to split: every query head gets its own copy
            key = key.repeat_interleave(heads // kv_heads, dim=1)
            value = value.repeat_interleave(heads // kv_heads, dim=1)
        q, k, v = (_seq_to_heads(t, group, size) for t in (query, key, value))
        if k.shape[1] != q.shape[1]:  # grouped-query attention within this rank's heads
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling,
                                             dropout_p=dropout if module.training else 0.0)
        return _heads_to_seq(out, group, size).transpose(1, 2).contiguous(), None

    return ulysses_attention


def register(group) -> str:
    """Register this process's Ulysses attention (one SP group per trainer process); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, make_attention(group))
    return ATTENTION


class SequenceShards:
    """The decoder body's hooks: shard the inputs over the SP group, gather the last hidden states."""

    def __init__(self, group):
        self.group, self.size, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        self.length = None

    def shard(self, module, args, kwargs):
        tokens = kwargs.get("input_ids")
        if tokens is None or args or kwargs.get("inputs_embeds") is not None:
            raise NotImplementedError("Ulysses sequence parallelism shards input_ids passed by keyword (text models)")
        b, length = tokens.shape
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(length, device=tokens.device).expand(b, -1)
        padded = -(-length // self.size) * self.size
        if padded > length:  # right padding, past every real token: causal attention never reads it for them
            tokens = F.pad(tokens, (0, padded - length))
            tail = positions[:, -1:] + torch.arange(1, padded - length + 1, device=positions.device)
            positions = torch.cat([positions, tail], dim=1)
        s = padded // self.size
        window = slice(self.rank * s, (self.rank + 1) * s)
        self.length = length
        return args, dict(kwargs, input_ids=tokens[:, window].contiguous(),
                          position_ids=positions[:, window].contiguous(), use_cache=False)

    def gather(self, module, args, kwargs, output):
        hidden = _GatherSequence.apply(output.last_hidden_state, self.group)[:, :self.length]
        output.last_hidden_state = hidden
        return output


def decoder_body(model: nn.Module, layers: list) -> nn.Module:
    """The module whose output is the last hidden state (Qwen2Model, LlamaModel, ...): the one holding the decoder
    `layers` (model.decoder_layers) directly, under any wrapper (CausalLM, the critic's ValueModel, peft)."""
    for module in model.modules():
        if any(child is layers[0] for child in getattr(module, "layers", ())):
            return module
    raise ValueError(f"{type(model).__name__}: no decoder body holding `layers` for Ulysses sequence parallelism")


def install(model: nn.Module, group, layers: list) -> nn.Module:
    """Shard `model`'s decoder body (the holder of `layers`) over `group`; its attention must be ATTENTION
    (model.load_hf_model)."""
    hooks = SequenceShards(group)
    body = decoder_body(model, layers)
    heads = getattr(getattr(body, "config", None), "num_attention_heads", None)
    if not isinstance(heads, int) or heads % hooks.size:
        raise ValueError(f"--context-parallel-size {hooks.size} (Ulysses): num_attention_heads {heads} of "
                         f"{type(body).__name__} must be divisible by it")
    body.register_forward_pre_hook(hooks.shard, with_kwargs=True)
    body.register_forward_hook(hooks.gather, with_kwargs=True)
    return model

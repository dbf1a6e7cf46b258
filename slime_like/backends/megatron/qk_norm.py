"""MiniMax-M2's query / key norm: one RMSNorm over all heads together, for megatron-core 0.16.

HF's MiniMaxM2Attention normalises the whole q_proj output (heads x head_dim wide) and the whole k_proj output
before RoPE; megatron-core's `--qk-layernorm` normalises each head on its own. slime swaps in its own attention class
through `--spec slime_plugins.models.minimax_m2 get_minimax_m2_layer_spec`; the Megatron trainer builds the same
model from that spec name with this subclass. Under TP a rank holds a contiguous block of heads: the norm gathers
them (all-gather over TP, whose backward splits the gradient), normalises, and keeps its own block again
(whose backward gathers). The weights are full width and replicated; HF names them self_attn.q_norm / k_norm.
"""
from __future__ import annotations

from dataclasses import replace

from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.spec_utils import ModuleSpec, build_module


class AcrossHeadsQKNormAttention(SelfAttention):
    def __init__(self, config, submodules, layer_number, qk_norm=None, **kwargs):
        super().__init__(config, replace(submodules, q_layernorm=None, k_layernorm=None), layer_number, **kwargs)
        width = self.hidden_size_per_attention_head
        self.q_norm = build_module(qk_norm, hidden_size=width * config.num_attention_heads, config=config,
                                   eps=config.layernorm_epsilon)
        self.k_norm = build_module(qk_norm, hidden_size=width * config.num_query_groups, config=config,
                                   eps=config.layernorm_epsilon)

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, output_gate=False, split_qkv=True):
        out = super().get_query_key_value_tensors(hidden_states, key_value_states, output_gate=output_gate,
                                                  split_qkv=split_qkv)
        query, key = _across_heads(self.q_norm, out[0]), _across_heads(self.k_norm, out[1])
        return (query, key, *out[2:])


def _across_heads(norm, x):
    """x [s, b, local heads, head_dim] -> the same, normalised over every head of every TP rank."""
    from megatron.core.tensor_parallel import (gather_from_tensor_model_parallel_region,
                                               scatter_to_tensor_model_parallel_region)
    from megatron.core import parallel_state as ps

    shape = x.shape
    flat = x.reshape(*shape[:-2], -1)
    if ps.get_tensor_model_parallel_world_size() == 1:
        return norm(flat).view(shape)
    full = norm(gather_from_tensor_model_parallel_region(flat))
    return scatter_to_tensor_model_parallel_region(full).view(shape)


def use_across_heads_qk_norm(spec, num_query_groups: int, tp: int):
    """Block or layer spec -> every self-attention with AcrossHeadsQKNormAttention (in place); returns spec."""
    if tp > num_query_groups:
        raise ValueError(f"--tensor-model-parallel-size {tp} > {num_query_groups} key/value heads: ranks would hold "
                         "copies of the same key heads, so MiniMax-M2's norm over all key heads cannot be gathered; "
                         f"use a TP size dividing {num_query_groups}")
    for layer in getattr(spec, "layer_specs", None) or [spec]:
        attention = layer.submodules.self_attention
        norm = attention.submodules.q_layernorm
        if norm is None:
            raise ValueError("MiniMax-M2's query / key norm needs --qk-layernorm (slime's minimax-m2.sh passes it)")
        layer.submodules.self_attention = ModuleSpec(module=AcrossHeadsQKNormAttention,
                                                     submodules=attention.submodules,
                                                     params=dict(attention.params or {}, qk_norm=norm))
    return spec

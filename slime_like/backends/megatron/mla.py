"""Multi-latent attention (DeepSeek-V3 / Kimi-K2 / Moonlight) without TransformerEngine.

megatron-core 0.16 builds MLA's core attention with `k_channels` / `v_channels` (the query/key head is
qk_head_dim + qk_pos_emb_head_dim wide, the value head v_head_dim), which only TE's attention accepts; its local
DotProductAttention takes neither. Its computation does not depend on the head widths except for the final
reshape, so this subclass accepts them and reshapes by the value width. The layer spec swaps it in where TE is
absent (the CPU path); with TE the stock spec is used.
"""
from __future__ import annotations

from megatron.core.transformer import multi_latent_attention as _mla
from megatron.core.transformer.dot_product_attention import DotProductAttention


class MLADotProductAttention(DotProductAttention):
    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None, pg_collection=None):
        super().__init__(config, layer_number, attn_mask_type, attention_type, attention_dropout=attention_dropout,
                         softmax_scale=softmax_scale, cp_comm_type=cp_comm_type, pg_collection=pg_collection)
        if v_channels is not None:  # context is [s, b, heads_per_partition * v_head_dim]
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition


class _NoTELinear:
    """Stands for TE's linear layer where TransformerEngine is absent: MLASelfAttention tests
    isinstance(linear_proj, TELinear), which fails with TypeError when the import left TELinear a non-type."""


def use_local_mla_attention(spec):
    """Point every MLA layer of a layer spec or block spec at MLADotProductAttention (in place); returns spec."""
    if not isinstance(_mla.TELinear, type):
        _mla.TELinear = _NoTELinear
    layers = getattr(spec, "layer_specs", None) or [spec]
    for layer in layers:
        attention = layer.submodules.self_attention
        if hasattr(attention.submodules, "linear_kv_down_proj"):
            attention.submodules.core_attention = MLADotProductAttention
    return spec

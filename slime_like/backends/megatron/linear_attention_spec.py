"""Qwen3-Next / Qwen3.5's hybrid layer spec: slime's `--spec slime_plugins.models.qwen3_next get_qwen3_next_spec`
(or `...qwen3_5 get_qwen3_5_spec`) built by the Megatron trainer.

As in slime's plugin, the model is megatron-core's block spec (dense and MoE layers per --moe-layer-freq) whose
self-attention becomes a gated delta net (gated_delta_net.py) in the layers config.json's layer_types calls
linear_attention; the other layers keep megatron-core's attention, with the output gate of --attention-output-gate.
--apply-layernorm-1p (HF's `x_normed * (1 + weight)`) is megatron-core's layernorm_zero_centered_gamma: TE's norms
take it; the local spec's torch norm refuses it, so ZeroCenteredRMSNorm replaces it there.
"""
from __future__ import annotations

import copy

import torch

from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec


class ZeroCenteredRMSNorm(torch.nn.Module):
    """RMSNorm whose scale is 1 + weight (HF Qwen3NextRMSNorm / Qwen3_5RMSNorm: fp32 math, cast back at the end)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        if getattr(config, "sequence_parallel", False):
            self.weight.sequence_parallel = True

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


def _is_torch_norm(module) -> bool:
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return module is WrappedTorchNorm


def use_zero_centered_norms(block_spec):
    """Every torch norm of a local block spec (layer norms, q / k norms, the final norm) -> ZeroCenteredRMSNorm."""
    if _is_torch_norm(block_spec.layer_norm):
        block_spec.layer_norm = ZeroCenteredRMSNorm
    for layer in block_spec.layer_specs:
        sub = layer.submodules
        for name in ("input_layernorm", "pre_mlp_layernorm"):
            if _is_torch_norm(getattr(sub, name)):
                setattr(sub, name, ZeroCenteredRMSNorm)
        attention = getattr(sub.self_attention, "submodules", None)
        for name in ("q_layernorm", "k_layernorm"):
            if attention is not None and _is_torch_norm(getattr(attention, name, None)):
                setattr(attention, name, ZeroCenteredRMSNorm)
    return block_spec


def block_spec_for(config, te: bool, vp_stage=None):
    """megatron-core's block spec for this stage, also for a dense model (every layer dense, as slime's plugin does)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if not config.num_moe_experts:
        config.moe_layer_freq = [0] * config.num_layers
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=te, normalization=config.normalization,
                                      vp_stage=vp_stage)
    spec.layer_specs = [copy.deepcopy(s) for s in spec.layer_specs]  # shared objects: each layer gets its own
    return spec


def use_linear_attention(block_spec, config, layout: dict | None, te: bool, vp_stage=None):
    """The linear_attention layers of this stage -> GatedDeltaNetAttention (in place); returns the spec."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from slime_like.backends.megatron.gated_delta_net import GatedDeltaNetAttention, LinearAttentionDims

    if layout is None:
        raise ValueError("--spec of Qwen3-Next / Qwen3.5 builds gated delta net layers from --hf-checkpoint's "
                         "config.json (layer_types, linear_num_key_heads, ...), which has no linear_num_value_heads; "
                         "pass the matching --hf-checkpoint or drop --spec")
    dims = LinearAttentionDims(**{k: v for k, v in layout.items() if k != "layer_types"})
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    for i, layer in enumerate(block_spec.layer_specs):
        if layout["layer_types"][offset + i] != "linear_attention":
            continue
        layer.submodules.self_attention = ModuleSpec(module=GatedDeltaNetAttention, params={"dims": dims})
        if layer.submodules.input_layernorm is IdentityOp and te:  # TE fuses the norm into linear_qkv: not here
            from megatron.core.extensions.transformer_engine import TENorm

            layer.submodules.input_layernorm = TENorm
    return block_spec

"""GLM-4 dense "sandwich" norms for megatron-core 0.16 (Megatron-LM's --post-self-attn-layernorm / --post-mlp-layernorm).

HF's Glm4DecoderLayer normalises the attention output and the MLP output again before each residual add:

    h = h + post_self_attn_layernorm(attn(input_layernorm(h)))
    h = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))

megatron-core 0.16's TransformerLayer has no slot for the two extra norms (slime gets them from THUDM's Megatron
fork through `--spec slime_plugins.models.glm4 get_glm_spec`). This subclass adds them as layer-level modules named
like the fork's (`decoder.layers.N.post_self_attn_layernorm`, `...post_mlp_layernorm`) and applies them with forward
hooks on the attention / MLP modules, so the rest of mcore's layer (bias-dropout-add, recompute, TP / SP / PP) is
untouched. A linear bias is folded in before the norm (the norm is of the whole output).
"""
from __future__ import annotations

from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_layer import TransformerLayer


def _post_norm_hook(norm):
    def hook(module, inputs, output):
        out, bias = output
        if bias is not None:
            out = out + bias
        return norm(out), None

    return hook


class SandwichTransformerLayer(TransformerLayer):
    def __init__(self, config, submodules, layer_number=1, hidden_dropout=None, pg_collection=None, vp_stage=None,
                 post_norm=None, post_self_attn=True, post_mlp=True):
        super().__init__(config, submodules, layer_number=layer_number, hidden_dropout=hidden_dropout,
                         pg_collection=pg_collection, vp_stage=vp_stage)
        new_norm = lambda: build_module(post_norm, config=config, hidden_size=config.hidden_size,  # noqa: E731
                                        eps=config.layernorm_epsilon)
        if post_self_attn:
            self.post_self_attn_layernorm = new_norm()
            self.self_attention.register_forward_hook(_post_norm_hook(self.post_self_attn_layernorm))
        if post_mlp:
            self.post_mlp_layernorm = new_norm()
            self.mlp.register_forward_hook(_post_norm_hook(self.post_mlp_layernorm))


def use_sandwich_norms(spec, norm, post_self_attn: bool, post_mlp: bool):
    """Layer spec or block spec -> the same with SandwichTransformerLayer layers (norm: the norm class to build)."""
    params = dict(post_norm=norm, post_self_attn=post_self_attn, post_mlp=post_mlp)

    def sandwich(layer):
        if layer.module is not TransformerLayer:  # e.g. mcore's MoE layer class: its hooks are not ours to redo
            raise ValueError(f"--post-self-attn-layernorm / --post-mlp-layernorm: layers built as "
                             f"{layer.module.__name__} cannot take sandwich norms here (GLM-4 dense layers only)")
        return ModuleSpec(module=SandwichTransformerLayer, submodules=layer.submodules, params=params)

    if getattr(spec, "layer_specs", None) is None:
        return sandwich(spec)
    spec.layer_specs = [sandwich(s) for s in spec.layer_specs]
    return spec

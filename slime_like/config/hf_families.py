"""The model families: what each Hugging Face model_type needs beyond the sizes config.json states.

`MODEL_FAMILIES` is the one table of model types (`family_of(cfg)` looks one up); hf_config.py turns a family plus
config.json into model flags, backends/megatron/hf_names.py maps its weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from slime_like.config.slime_paths import QWEN3_5_SPEC, QWEN3_NEXT_SPEC


@dataclass(frozen=True)
class ModelFamily:
    """What an HF model_type needs beyond the sizes config.json states."""
    qkv_bias: bool = False         # bias on the q/k/v projections (Qwen2) even without attention_bias
    qk_norm: bool = False          # RMSNorm on queries and keys per head (Qwen3)
    # one RMSNorm over all query heads together and one over all key heads (MiniMax-M2), built through slime's spec
    # name for it (slime_paths.MINIMAX_M2_SPEC; backends/megatron/qk_norm.py)
    qk_norm_across_heads: bool = False
    glm_sandwich: bool = False     # GLM-4: norms after attention and MLP, RoPE on interleaved pairs
    # DeepSeek-V3-style router: sigmoid scores + a per-expert correction bias (HF e_score_correction_bias) for the
    # choice, group-limited top-k, renormalised top-k weights times routed_scaling_factor, shared experts
    biased_router: bool = False
    fused_gate_up: bool = False    # the MLP's gate and up projections are one HF tensor gate_up_proj (GLM-4)
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(shared_expert_gate(x)) scales the shared expert's output
    # Qwen3-Next / Qwen3.5: gated delta net layers where config.json's layer_types says linear_attention, gated
    # full attention elsewhere, zero-centred RMSNorms (1 + weight); built through slime's spec name (this one)
    linear_attention_spec: tuple = ()
    # DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): MLA whose keys an indexer narrows to the top index_topk;
    # built as dense MLA, identical while no sample is longer than index_topk (config/sparse_attention.py)
    sparse_attention: bool = False
    trainable: bool = False        # the Megatron trainer builds it and maps its HF weights (hf_names.py)
    vision_language: bool = False  # a VLM's text_config: the HF vision tower + M-RoPE (backends/megatron/vision.py)
    not_built: str = ""            # why the trainer refuses a family slime trains (read_hf_config says it)
    # how its checkpoints hold MTP layers, where the trainer maps them (backends/megatron/mtp.py) so
    # --enable-mtp-training trains them: "mimo" (model.mtp_layers.N.*) or "appended" (DeepSeek-V3 / GLM-4.5:
    # model.layers.<num_hidden_layers + N>.* with eh_proj / enorm / hnorm / shared_head)
    mtp_layout: str = ""


_NEXT = dict(qk_norm=True, shared_expert_gate=True, trainable=True, linear_attention_spec=QWEN3_NEXT_SPEC)
_QWEN3_5 = dict(_NEXT, linear_attention_spec=QWEN3_5_SPEC)
# model_type -> family. Add a family here (and its weight names in backends/megatron/hf_names.py to train it).
MODEL_FAMILIES = {
    "llama": ModelFamily(trainable=True),
    "qwen2": ModelFamily(qkv_bias=True, trainable=True),
    # MiMo: Qwen2 plus MTP layers (num_nextn_predict_layers, model.mtp_layers.N.*: trained with
    # --enable-mtp-training, else dropped, see dropped_mtp_note); its modeling code is remote code subclassing
    # transformers' Qwen2 (transformers has no mimo model_type)
    "mimo": ModelFamily(qkv_bias=True, trainable=True, mtp_layout="mimo"),
    "qwen2_moe": ModelFamily(qkv_bias=True, shared_expert_gate=True, trainable=True),
    "qwen3": ModelFamily(qk_norm=True, trainable=True),
    "qwen3_moe": ModelFamily(qk_norm=True, trainable=True),
    "glm4": ModelFamily(glm_sandwich=True, fused_gate_up=True, trainable=True),
    # GLM-4.5/4.6: no sandwich norms (unlike glm4)
    "glm4_moe": ModelFamily(biased_router=True, trainable=True, mtp_layout="appended"),
    # + multi-latent attention (kv_lora_rank)
    "deepseek_v3": ModelFamily(biased_router=True, trainable=True, mtp_layout="appended"),
    # GLM-4.7-Flash: DeepSeek-V3's layout (MLA + GLM-4.5's router); dense / MoE layers from mlp_layer_types
    "glm4_moe_lite": ModelFamily(biased_router=True, trainable=True),
    # Kimi-K2's config.json: model_type kimi_k2 (remote code), DeepseekV3ForCausalLM weights and architecture
    "kimi_k2": ModelFamily(biased_router=True, trainable=True),
    # MiniMax-M2: every layer MoE (sigmoid router with correction bias, no groups, no shared expert), partial RoPE
    "minimax_m2": ModelFamily(biased_router=True, qk_norm_across_heads=True, trainable=True),
    "deepseek_v32": ModelFamily(biased_router=True, sparse_attention=True, trainable=True),
    "glm_moe_dsa": ModelFamily(biased_router=True, sparse_attention=True, trainable=True),  # GLM-5
    # vision-language (config.json's text_config; the HF vision tower and M-RoPE: backends/megatron/vision.py)
    "qwen2_5_vl_text": ModelFamily(qkv_bias=True, trainable=True, vision_language=True),
    "qwen3_vl_text": ModelFamily(qk_norm=True, trainable=True, vision_language=True),
    "qwen3_next": ModelFamily(**_NEXT),
    # Qwen3.5's checkpoints are vision-language (model_type qwen3_5 / qwen3_5_moe, the text model's config under
    # text_config with model_type qwen3_5_text / qwen3_5_moe_text, weights under model.language_model.*): the
    # trainer builds and trains the text model; the vision tower is left as it is
    "qwen3_5": ModelFamily(**_QWEN3_5),
    "qwen3_5_moe": ModelFamily(**_QWEN3_5),
    "qwen3_5_text": ModelFamily(**_QWEN3_5),
    "qwen3_5_moe_text": ModelFamily(**_QWEN3_5),
}
_GENERIC = ModelFamily()  # an unknown model_type: MODEL_ARGS from the sizes alone (tools/model_args)


def family_of(cfg: dict) -> ModelFamily:
    return MODEL_FAMILIES.get(cfg.get("model_type", ""), _GENERIC)


def trainable_model_types() -> list[str]:
    return sorted(t for t, f in MODEL_FAMILIES.items() if f.trainable)

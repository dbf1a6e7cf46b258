"""Which Hugging Face tensors each megatron-core parameter is made of, for every family hf_weights.py converts.

One table (`rule`) maps each mcore parameter of a chunk to the HF tensor(s) it is made of (its kind says how
hf_weights.py merges and splits them):

  embedding.word_embeddings / output_layer   <- embed_tokens / lm_head, rows padded to the padded vocab
  linear_qkv (weight, bias)                  <- q/k/v_proj fused per KV group: [q rows of group g, k_g, v_g]
  linear_proj <- o_proj;  linear_fc2 <- down_proj;  linear_fc1 = [gate; up] (each half split over TP; GLM-4 keeps
  the two halves fused in one gate_up_proj);  post_self_attn_layernorm / post_mlp_layernorm <- same names (GLM-4)
  input_layernorm | linear_qkv.layer_norm_weight (TE)      <- input_layernorm
  pre_mlp_layernorm | linear_fc1.layer_norm_weight (TE)    <- post_attention_layernorm
  q_layernorm / k_layernorm <- q_norm / k_norm (Qwen3);  router <- mlp.gate;  experts.E <- experts.E (MoE)
  router.expert_bias (a buffer) <- mlp.gate.e_score_correction_bias;  shared_experts <- shared_experts (GLM-4.5)
  shared_experts.gate_weight <- mlp.shared_expert_gate (Qwen2-MoE, whose shared expert is mlp.shared_expert.*)

Layer indices are global (`layer.layer_number - 1`), so PP stages load/export their own layers.
"""
from __future__ import annotations

import re

from slime_like.backends.megatron import mtp
from slime_like.backends.megatron.model import ValueHead
from slime_like.config.hf_families import family_of

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LOCAL_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.linear_fc([12])\.(weight|bias)$")
_GROUPED_EXPERT = re.compile(r"^mlp\.experts\.linear_fc([12])\.(weight|bias)(\d+)$")  # TE grouped GEMM
_SIMPLE = {  # layer-relative mcore name -> layer-relative HF name
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.linear_fc2.bias": "mlp.down_proj.bias",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias",  # a buffer (DeepSeek-V3 / GLM-4.5 routers)
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
    "mlp.shared_experts.gate_weight": "mlp.shared_expert_gate.weight",  # Qwen2-MoE: [1, hidden] sigmoid gate
    "post_self_attn_layernorm.weight": "post_self_attn_layernorm.weight",  # GLM-4 dense sandwich norms
    "post_mlp_layernorm.weight": "post_mlp_layernorm.weight",
    "self_attention.q_norm.weight": "self_attn.q_norm.weight",  # MiniMax-M2: one norm over all heads
    "self_attention.k_norm.weight": "self_attn.k_norm.weight",
}
# MiniMax-M2 (Mixtral's names): the MoE block is block_sparse_moe, experts' gate / up / down are w1 / w3 / w2
_BLOCK_SPARSE_MOE = [(re.compile(r"\.mlp\.gate\.e_score_correction_bias$"),
                      ".block_sparse_moe.e_score_correction_bias"),
                     (re.compile(r"\.mlp\.gate\.weight$"), ".block_sparse_moe.gate.weight"),
                     (re.compile(r"\.mlp\.experts\.(\d+)\.gate_proj\."), r".block_sparse_moe.experts.\1.w1."),
                     (re.compile(r"\.mlp\.experts\.(\d+)\.up_proj\."), r".block_sparse_moe.experts.\1.w3."),
                     (re.compile(r"\.mlp\.experts\.(\d+)\.down_proj\."), r".block_sparse_moe.experts.\1.w2.")]

_VLM_TEXT = re.compile(r"^model\.")
# Qwen2-MoE (and Qwen3-Next / Qwen3.5) name their one shared expert in the singular
_SINGULAR_SHARED_EXPERT = [(re.compile(r"\.mlp\.shared_experts\."), ".mlp.shared_expert.")]


# multi-latent attention (DeepSeek-V3): layer-relative mcore name -> (kind, HF name); TE fuses the latent norms.
# Tensors copy unchanged: HF's rope_interleave rotates interleaved pairs of the RoPE part and megatron-core's MLA
# does the same (it de-interleaves q_pe / k_pe before rotating halves).
_MLA = {
    "self_attention.linear_q_down_proj.weight": ("copy", "self_attn.q_a_proj.weight"),
    "self_attention.q_layernorm.weight": ("copy", "self_attn.q_a_layernorm.weight"),
    "self_attention.linear_q_up_proj.layer_norm_weight": ("copy", "self_attn.q_a_layernorm.weight"),
    "self_attention.linear_q_up_proj.weight": ("copy", "self_attn.q_b_proj.weight"),
    "self_attention.linear_q_proj.weight": ("copy", "self_attn.q_proj.weight"),
    "self_attention.linear_kv_down_proj.weight": ("copy", "self_attn.kv_a_proj_with_mqa.weight"),
    "self_attention.kv_layernorm.weight": ("copy", "self_attn.kv_a_layernorm.weight"),
    "self_attention.linear_kv_up_proj.layer_norm_weight": ("copy", "self_attn.kv_a_layernorm.weight"),
    "self_attention.linear_kv_up_proj.weight": ("copy", "self_attn.kv_b_proj.weight"),
    # DeepSeek sparse attention's lightning indexer (backends/megatron/dsa.py: slime's glm5 names)
    "self_attention.wq_b.weight": ("copy", "self_attn.indexer.wq_b.weight"),
    "self_attention.wk.weight": ("copy", "self_attn.indexer.wk.weight"),
    "self_attention.k_norm.weight": ("copy", "self_attn.indexer.k_norm.weight"),
    "self_attention.k_norm.bias": ("copy", "self_attn.indexer.k_norm.bias"),
    "self_attention.weights_proj.weight": ("copy", "self_attn.indexer.weights_proj.weight"),
}


# gated delta net (gated_delta_net.py): mcore-style names <- HF linear_attn.*; in_proj is [q; k; v; z; beta; alpha]
# (each section split over TP), which Qwen3.5 keeps as four tensors and Qwen3-Next as two, interleaved per key head
_GATED_DELTA_NET = {
    "self_attention.in_proj.weight": ("gdn_in", None),
    "self_attention.conv1d.weight": ("gdn_conv", ["conv1d.weight"]),
    "self_attention.dt_bias": ("copy", ["dt_bias"]),
    "self_attention.A_log": ("copy", ["A_log"]),
    "self_attention.out_norm.weight": ("copy", ["norm.weight"]),
    "self_attention.out_proj.weight": ("copy", ["out_proj.weight"]),
}
GDN_IN_PROJ = {"qwen3_next": ["in_proj_qkvz.weight", "in_proj_ba.weight"],
                "qwen3_5": ["in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"]}


# vision-language models (backends/megatron/vision.py): transformers 5's in-memory names, the ones pushed to engines;
# a checkpoint on disk may use the older layout (Qwen2.5-VL: model.layers.* and visual.*), read and written as found
VLM_LM, _VLM_VISUAL = "model.language_model.", "model.visual."
_LEGACY_VLM = ((VLM_LM, "model."), (_VLM_VISUAL, "visual."))


def vlm_legacy_name(name: str) -> str:
    for new, old in _LEGACY_VLM:
        if name.startswith(new):
            return old + name[len(new):]
    return name


def rule(name: str, chunk, args):
    """(kind, hf_names) for one mcore parameter; kind in copy | vocab | qkv | gate_up | gate_up_fused | gdn_in |
    gdn_conv | skip."""
    if name.startswith("visual."):  # the HF vision tower, kept as transformers' module: its own names
        return "copy", [_VLM_VISUAL + name[len("visual."):]]
    kind, names = _generic_rule(name, chunk, args)
    family = family_of({"model_type": args.hf_model_type})
    renames = _BLOCK_SPARSE_MOE if args.hf_model_type == "minimax_m2" else \
        _SINGULAR_SHARED_EXPERT if family.shared_expert_gate else []  # Qwen2-MoE, Qwen3-Next, Qwen3.5
    for pattern, repl in renames:
        names = [pattern.sub(repl, n) for n in names]
    if args.hf_text_of_vlm:  # Qwen3.5: the text model of a vision-language checkpoint
        names = [_VLM_TEXT.sub("model.language_model.", n) for n in names]
    return kind, names


def _generic_rule(name: str, chunk, args):
    if name == "embedding.word_embeddings.weight":  # (+ DeepSeek-V3 / GLM-4.5 MTP layers' copies: mtp.py)
        return "vocab", ["model.embed_tokens.weight"] + mtp.vocab_copies(chunk, args, "embed_tokens")
    if name == "output_layer.weight":
        if isinstance(chunk.output_layer, ValueHead):
            return "skip", []  # critic value head: not part of the HF LM
        tied = not args.untie_embeddings_and_output_weights
        # tied with PP>1: the last stage keeps its own copy of the embedding for the LM head
        return ("vocab", ["model.embed_tokens.weight"]) if tied else \
            ("vocab", ["lm_head.weight"] + mtp.vocab_copies(chunk, args, "shared_head.head"))
    if name == "decoder.final_layernorm.weight":
        return "copy", ["model.norm.weight"]
    mtp_rule = mtp.hf_rule(name, lambda rest, pre: _layer_rule(rest, pre, name, args), args)
    if mtp_rule is not None:  # --enable-mtp-training: MiMo's model.mtp_layers.N.*
        return mtp_rule
    m = _LAYER.match(name)
    if not m:
        raise KeyError(f"no HF mapping for megatron parameter {name!r}")
    layer = chunk.decoder.layers[int(m.group(1))].layer_number - 1  # global index (PP offset)
    return _layer_rule(m.group(2), f"model.layers.{layer}.", name, args)


def _layer_rule(rest: str, pre: str, name: str, args):
    """(kind, HF names) of a transformer layer's parameter, `rest` its layer-relative name, `pre` the HF prefix of
    the layer (`model.layers.L.`, or an MTP layer's `model.mtp_layers.N.`)."""
    if args.multi_latent_attention and rest in _MLA:
        return _MLA[rest][0], [pre + _MLA[rest][1]]
    if rest in _SIMPLE:
        return "copy", [pre + _SIMPLE[rest]]
    if rest in _GATED_DELTA_NET:  # Qwen3-Next / Qwen3.5 linear-attention layers
        kind, hf = _GATED_DELTA_NET[rest]
        if kind == "gdn_in":
            hf = GDN_IN_PROJ["qwen3_next" if args.hf_model_type == "qwen3_next" else "qwen3_5"]
        return kind, [f"{pre}linear_attn.{n}" for n in hf]
    if rest.startswith("self_attention.linear_qkv.") and rest.rsplit(".", 1)[1] in ("weight", "bias"):
        kind = rest.rsplit(".", 1)[1]
        return "qkv", [f"{pre}self_attn.{p}_proj.{kind}" for p in "qkv"]
    if rest in ("mlp.linear_fc1.weight", "mlp.linear_fc1.bias"):
        kind = rest.rsplit(".", 1)[1]
        if family_of({"model_type": args.hf_model_type}).fused_gate_up:  # GLM-4: one [gate; up]
            return "gate_up_fused", [f"{pre}mlp.gate_up_proj.{kind}"]
        return "gate_up", [f"{pre}mlp.gate_proj.{kind}", f"{pre}mlp.up_proj.{kind}"]
    if rest == "mlp.shared_experts.linear_fc1.weight":
        return "gate_up", [f"{pre}mlp.shared_experts.gate_proj.weight", f"{pre}mlp.shared_experts.up_proj.weight"]
    e = _LOCAL_EXPERT.match(rest) or _GROUPED_EXPERT.match(rest)
    if e:
        if e.re is _LOCAL_EXPERT:
            local, fc, kind = int(e.group(1)), e.group(2), e.group(3)
        else:
            fc, kind, local = e.group(1), e.group(2), int(e.group(3))
        expert = f"{pre}mlp.experts.{global_expert(local, args)}."
        if fc == "1":
            return "gate_up", [f"{expert}gate_proj.{kind}", f"{expert}up_proj.{kind}"]
        return "copy", [f"{expert}down_proj.{kind}"]
    raise KeyError(f"no HF mapping for megatron parameter {name!r} (layer-relative {rest!r})")


def global_expert(local: int, args) -> int:
    from megatron.core import parallel_state as ps

    return ps.get_expert_model_parallel_rank() * (args.num_experts // ps.get_expert_model_parallel_world_size()) + local

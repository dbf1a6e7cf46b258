"""Hugging Face config.json <-> Megatron model flags.

`model_flags_from_hf(cfg)` writes the MODEL_ARGS a scripts/models/*.sh file would hold (the tool
`python -m slime_like.tools.model_args PATH` prints it); `check_model_against_hf(args)` compares the parsed
model flags with --hf-checkpoint's config.json and names every mismatch. When no model flag is given at all,
the flags are filled from config.json instead (our choice; slime requires MODEL_ARGS).
"""
from __future__ import annotations

import json
import os

from slime_like.config.errors import ConfigError

# dest -> what it is called in config.json (for messages)
CHECKED = {
    "hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads", "ffn_hidden_size": "intermediate_size", "vocab_size": "vocab_size",
    "rotary_base": "rope_theta", "norm_epsilon": "rms_norm_eps", "untie_embeddings_and_output_weights":
    "tie_word_embeddings (negated)", "kv_channels": "head_dim", "num_experts": "num_experts",
    "moe_router_topk": "num_experts_per_tok", "moe_ffn_hidden_size": "moe_intermediate_size",
    "multi_latent_attention": "kv_lora_rank (present)", "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
    "qk_head_dim": "qk_nope_head_dim", "qk_pos_emb_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim",
}
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")
QK_NORM_TYPES = ("qwen3", "qwen3_moe")


def read_hf_config(path: str) -> dict:
    """config.json of a checkpoint dir (or the file itself) as a dict; text configs nested under text_config win."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    with open(file) as f:
        try:
            cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{file}: not valid JSON ({e.msg}, line {e.lineno})") from None
    return cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg


def _rope(cfg: dict):
    """(theta, rope_scaling dict or None): transformers 5 nests them in rope_parameters."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    return theta, scaling


def model_flags_from_hf(cfg: dict) -> list:
    """MODEL_ARGS for config.json `cfg`, as a flat list of CLI tokens (values as strings)."""
    mt = cfg.get("model_type", "")
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    kv = cfg.get("num_key_value_heads") or heads
    out = []
    if cfg.get("hidden_act", "silu") in ("silu", "swish"):
        out.append("--swiglu")
    out += ["--num-layers", cfg["num_hidden_layers"], "--hidden-size", hidden,
            "--ffn-hidden-size", cfg["intermediate_size"], "--num-attention-heads", heads]
    if kv != heads:
        out += ["--group-query-attention", "--num-query-groups", kv]
    head_dim = cfg.get("head_dim")
    if head_dim and (head_dim != hidden // heads or mt in QK_NORM_TYPES):
        out += ["--kv-channels", head_dim]
    out += ["--use-rotary-position-embeddings"]
    if not cfg.get("mlp_bias", False):
        out.append("--disable-bias-linear")
    if mt in QKV_BIAS_TYPES or cfg.get("attention_bias", False):
        out.append("--add-qkv-bias")
    if mt in QK_NORM_TYPES:
        out.append("--qk-layernorm")
    if "rms_norm_eps" in cfg:
        out += ["--normalization", "RMSNorm", "--norm-epsilon", _num(cfg["rms_norm_eps"])]
    else:
        out += ["--normalization", "LayerNorm", "--norm-epsilon", _num(cfg.get("layer_norm_eps", 1e-5))]
    theta, scaling = _rope(cfg)
    out += ["--rotary-base", int(theta)]
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        out += ["--rotary-percent", _num(cfg["partial_rotary_factor"])]
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        out += ["--use-rope-scaling", "--rope-scaling-factor", _num(scaling.get("factor", 8.0))]
    if mt.startswith("glm4"):
        # GLM-4: extra norms after attention and MLP ("sandwich"), RoPE applied to interleaved pairs (HF Glm4),
        # which Megatron's fused RoPE kernel does not do.
        out += ["--post-self-attn-layernorm", "--post-mlp-layernorm", "--rotary-interleaved", "--no-rope-fusion"]
    out += ["--vocab-size", cfg["vocab_size"]]
    if not cfg.get("tie_word_embeddings", False):
        out.append("--untie-embeddings-and-output-weights")
    n_exp = cfg.get("num_experts") or cfg.get("n_routed_experts")
    if n_exp:
        out += ["--num-experts", n_exp, "--moe-router-topk", cfg["num_experts_per_tok"],
                "--moe-ffn-hidden-size", cfg["moe_intermediate_size"],
                "--moe-layer-freq", _layer_freq_expr(moe_layer_pattern_from_hf(cfg))]
        if cfg.get("shared_expert_intermediate_size"):
            out += ["--moe-shared-expert-intermediate-size", cfg["shared_expert_intermediate_size"]]
        if not cfg.get("norm_topk_prob", True):
            out.append("--moe-router-pre-softmax")  # softmax over all experts, no renormalisation over the top-k
        out += ["--moe-router-score-function", "softmax", "--moe-aux-loss-coeff", _num(cfg.get("router_aux_loss_coef", 0.0))]
    return [str(t) for t in out]


def moe_layer_pattern_from_hf(cfg: dict) -> list:
    """Per layer 1 (MoE) or 0 (dense), from Qwen-MoE's decoder_sparse_step / mlp_only_layers."""
    n, step = cfg["num_hidden_layers"], cfg.get("decoder_sparse_step", 1) or 1
    dense = set(cfg.get("mlp_only_layers") or [])
    return [1 if (i not in dense and (i + 1) % step == 0) else 0 for i in range(n)]


def _layer_freq_expr(pattern: list) -> str:
    if all(pattern):
        return f"[1]*{len(pattern)}"
    return "[" + ",".join(str(v) for v in pattern) + "]"


def _num(x) -> str:
    return repr(float(x))


def expected_from_hf(cfg: dict) -> dict:
    """dest -> the value config.json implies, for the checked fields."""
    theta, _ = _rope(cfg)
    heads = cfg["num_attention_heads"]
    exp = {"hidden_size": cfg["hidden_size"], "num_layers": cfg["num_hidden_layers"], "num_attention_heads": heads,
           "num_query_groups": cfg.get("num_key_value_heads") or heads, "ffn_hidden_size": cfg["intermediate_size"],
           "vocab_size": cfg["vocab_size"], "rotary_base": float(theta),
           "norm_epsilon": float(cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", 1e-5))),
           "untie_embeddings_and_output_weights": not cfg.get("tie_word_embeddings", False),
           "kv_channels": cfg.get("head_dim") or cfg["hidden_size"] // heads}
    if "kv_lora_rank" in cfg:  # multi-latent attention: no GQA groups, per-part head dims instead of head_dim
        del exp["num_query_groups"], exp["kv_channels"]
        exp.update(multi_latent_attention=True, q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=cfg["kv_lora_rank"],
                   qk_head_dim=cfg["qk_nope_head_dim"], qk_pos_emb_head_dim=cfg["qk_rope_head_dim"],
                   v_head_dim=cfg["v_head_dim"])
    n_exp = cfg.get("num_experts") or cfg.get("n_routed_experts")
    if n_exp:
        exp.update(num_experts=n_exp, moe_router_topk=cfg["num_experts_per_tok"],
                   moe_ffn_hidden_size=cfg["moe_intermediate_size"])
    return exp


def check_model_against_hf(args) -> None:
    path = args.hf_checkpoint
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return
    cfg = read_hf_config(path)
    if not all(k in cfg for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")):
        return  # not a decoder-only LM config we know how to read
    problems = []
    for dest, want in expected_from_hf(cfg).items():
        have = getattr(args, dest)
        same = abs(float(have) - float(want)) <= 1e-9 * max(1.0, abs(float(want))) \
            if isinstance(want, float) and have is not None else have == want
        if not same:
            flag = "--" + dest.replace("_", "-")
            problems.append(f"{flag} {have} but config.json has {CHECKED[dest]} = {want}")
    if problems:
        raise ConfigError(f"the model flags disagree with --hf-checkpoint {path}/config.json: " + "; ".join(problems)
                          + ". Source the matching scripts/models/*.sh or regenerate it with "
                          f"`python -m slime_like.tools.model_args {path}`")


def fill_model_from_hf(args) -> None:
    """No MODEL_ARGS given (no --num-layers, no --hidden-size): take the architecture from config.json.

    Runs before the derived model defaults; --dry-run shows the values as part of the resolved config."""
    path = args.hf_checkpoint
    if args.num_layers is not None or args.hidden_size is not None or not path \
            or not os.path.isfile(os.path.join(path, "config.json")):
        return
    cfg = read_hf_config(path)
    if not all(k in cfg for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")):
        return
    from slime_like.config.parser import build_parser, group_of

    parser, _ = build_parser()
    derived, _ = parser.parse_known_args(model_flags_from_hf(cfg))
    for dest, group in group_of(parser).items():
        if group.startswith("model") and getattr(derived, dest) != parser.get_default(dest):
            setattr(args, dest, getattr(derived, dest))
    # HF decoder LMs train without hidden dropout; Megatron's 0.1 defaults would make the trainer's log-probs
    # differ from the engine's. slime recipes pass both as 0.0 explicitly. A value the user set is kept.
    if args.attention_dropout == parser.get_default("attention_dropout"):
        args.attention_dropout = float(cfg.get("attention_dropout", 0.0))
    if args.hidden_dropout == parser.get_default("hidden_dropout"):
        args.hidden_dropout = 0.0
    args.model_args_from_hf = True

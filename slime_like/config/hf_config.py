"""Hugging Face config.json <-> Megatron model flags: the one owner of that translation.

`read_hf_config(path)` reads config.json; the model families it knows are hf_families.py's table, the per-layer
layouts beyond the sizes hf_layer_layouts.py's. `model_flags_from_hf(cfg)` writes the MODEL_ARGS a
scripts/models/*.sh file would hold (the tool `python -m slime_like.tools.model_args PATH` prints it);
`check_model_against_hf(args)` compares the parsed model flags with --hf-checkpoint's config.json and names every
mismatch. When no model flag is given at all, the flags are filled from config.json instead (our choice; slime
requires MODEL_ARGS).
"""
from __future__ import annotations

import copy
import json
import os

from slime_like.config.errors import ConfigError
from slime_like.config.hf_families import family_of, trainable_model_types
from slime_like.config.hf_layer_layouts import linear_attention_layout, sparse_attention_settings
from slime_like.config.hf_rope import partial_rotary, yarn_settings
from slime_like.config.hf_rope import rope_and_scaling as _rope
from slime_like.config.slime_paths import MINIMAX_M2_SPEC

# dest -> what it is called in config.json (for messages)
CHECKED = {
    "hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads", "ffn_hidden_size": "intermediate_size", "vocab_size": "vocab_size",
    "rotary_base": "rope_theta", "norm_epsilon": "rms_norm_eps", "untie_embeddings_and_output_weights":
    "tie_word_embeddings (negated)", "kv_channels": "head_dim", "num_experts": "num_experts",
    "moe_router_topk": "num_experts_per_tok", "moe_ffn_hidden_size": "moe_intermediate_size",
    "multi_latent_attention": "kv_lora_rank (present)", "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
    "qk_head_dim": "qk_nope_head_dim", "qk_pos_emb_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim",
    "rotary_scaling_factor": "rope_scaling.factor (yarn)", "mscale": "rope_scaling.mscale (yarn)",
    "mscale_all_dim": "rope_scaling.mscale_all_dim (yarn)",
    "moe_shared_expert_gate": "shared_expert_gate (Qwen2-MoE)",
    "attention_output_gate": "layer_types (gated attention in the full-attention layers)",
    "apply_layernorm_1p": "model_type (zero-centred RMSNorm weights: 1 + weight)",
}


def read_hf_config(path: str, *, for_training: bool = False) -> dict:
    """config.json of a checkpoint dir (or the file itself) as a dict; text configs nested under text_config win.

    `for_training`: refuse a model_type the Megatron trainer cannot build."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} not found: --hf-checkpoint must be a Hugging Face model directory")
    with open(file) as f:
        try:
            cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{file}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if isinstance(cfg.get("text_config"), dict):  # a vision-language checkpoint: its text model
        outer, cfg = cfg, dict(cfg["text_config"])
        # the LM head is tied (or not) by the outer model: Qwen3.5 states it at the top level
        cfg["tie_word_embeddings"] = outer.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        cfg["_text_of_vlm"] = True  # HF weights live under model.language_model.* (hf_names.py)
        for key in ("dtype", "torch_dtype"):  # the checkpoint's dtype (HF exports keep it)
            if key in outer and key not in cfg:
                cfg[key] = outer[key]
    if "intermediate_size" not in cfg and cfg.get("moe_intermediate_size"):  # Qwen3.5-MoE: every layer MoE, so
        cfg["intermediate_size"] = cfg["moe_intermediate_size"]  # no dense width (slime passes the expert one)
    if for_training and not family_of(cfg).trainable:
        why = family_of(cfg).not_built
        raise ConfigError(f"{file}: model_type {cfg.get('model_type')!r} is not supported by the trainer"
                          + (f" ({why})" if why else "") + f"; supported: {', '.join(trainable_model_types())}")
    if for_training and "kv_lora_rank" in cfg and not cfg.get("rope_interleave", True):
        raise ConfigError(f"{file}: rope_interleave false: megatron-core's multi-latent attention rotates "
                          "interleaved RoPE pairs (DeepSeek's layout) only")
    return cfg


def model_flags_from_hf(cfg: dict) -> list:
    """MODEL_ARGS for config.json `cfg`, as a flat list of CLI tokens (values as strings)."""
    family = family_of(cfg)
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
    if "kv_lora_rank" in cfg:
        out += _mla_flags(cfg)
    elif head_dim and (head_dim != hidden // heads or family.qk_norm or family.qk_norm_across_heads):
        out += ["--kv-channels", head_dim]
    out += ["--use-rotary-position-embeddings"]
    if not cfg.get("mlp_bias", False):
        out.append("--disable-bias-linear")
    if family.qkv_bias or cfg.get("attention_bias", False):
        out.append("--add-qkv-bias")
    if family.qk_norm or family.qk_norm_across_heads or cfg.get("use_qk_norm", False):
        out.append("--qk-layernorm")
    if family.qk_norm_across_heads:
        out += ["--spec", *MINIMAX_M2_SPEC]
    if family.linear_attention_spec:  # slime's spelling: both gate flags, zero-centred norms, its spec name
        out += ["--spec", *family.linear_attention_spec, "--attention-output-gate", "--use-gated-attention",
                "--apply-layernorm-1p"]
    if "rms_norm_eps" in cfg:
        out += ["--normalization", "RMSNorm", "--norm-epsilon", _num(cfg["rms_norm_eps"])]
    else:
        out += ["--normalization", "LayerNorm", "--norm-epsilon", _num(cfg.get("layer_norm_eps", 1e-5))]
    theta, scaling = _rope(cfg)
    out += ["--rotary-base", int(theta)]
    if partial_rotary(cfg) != 1.0:
        out += ["--rotary-percent", _num(partial_rotary(cfg))]
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        out += ["--use-rope-scaling", "--rope-scaling-factor", _num(scaling.get("factor", 8.0))]
    if family.glm_sandwich:
        # GLM-4: extra norms after attention and MLP ("sandwich"), RoPE applied to interleaved pairs (HF Glm4),
        # which Megatron's fused RoPE kernel does not do.
        out += ["--post-self-attn-layernorm", "--post-mlp-layernorm", "--rotary-interleaved", "--no-rope-fusion"]
    out += ["--vocab-size", cfg["vocab_size"]]
    if not cfg.get("tie_word_embeddings", False):
        out.append("--untie-embeddings-and-output-weights")
    n_exp = _num_experts(cfg)
    if n_exp:
        out += ["--num-experts", n_exp, "--moe-router-topk", cfg["num_experts_per_tok"],
                "--moe-ffn-hidden-size", _expert_ffn(cfg),
                "--moe-layer-freq", _layer_freq_expr(moe_layer_pattern_from_hf(cfg))]
        shared = cfg.get("shared_expert_intermediate_size") or \
            cfg.get("n_shared_experts", 0) * _expert_ffn(cfg)
        if shared:
            out += ["--moe-shared-expert-intermediate-size", shared]
            if family.shared_expert_gate:
                out.append("--moe-shared-expert-gate")
        out += _router_flags(cfg)
    return [str(t) for t in out]


def _mla_flags(cfg: dict) -> list:
    """Multi-latent attention (DeepSeek-V3, Kimi-K2, Moonlight): low-rank q / kv, per-part head dims, norms on the
    latents (--qk-layernorm builds them); RoPE on a separate head part (HF rope_interleave: see hf_names.py)."""
    out = ["--multi-latent-attention", "--kv-lora-rank", cfg["kv_lora_rank"], "--qk-head-dim", cfg["qk_nope_head_dim"],
           "--qk-pos-emb-head-dim", cfg["qk_rope_head_dim"], "--v-head-dim", cfg["v_head_dim"], "--qk-layernorm"]
    if cfg.get("q_lora_rank"):
        out += ["--q-lora-rank", cfg["q_lora_rank"]]
    yarn = yarn_settings(cfg)
    out += ["--rotary-scaling-factor", _num(yarn["rotary_scaling_factor"])]  # 1.0: no scaling (slime's files say so)
    if yarn["rotary_scaling_factor"] != 1.0:
        out += ["--mscale", _num(yarn["mscale"]), "--mscale-all-dim", _num(yarn["mscale_all_dim"])]
    return out


def router_settings(cfg: dict) -> dict:
    """dest -> value of the MoE router flags config.json implies."""
    if family_of(cfg).biased_router:
        # bias update rate 0: fine-tuning keeps the published correction bias (slime's recipes do the same);
        # megatron-core renormalises sigmoid top-k weights, which is HF's norm_topk_prob = true
        return dict(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                    moe_router_bias_update_rate=0.0, moe_router_num_groups=cfg.get("n_group") or 1,
                    moe_router_group_topk=cfg.get("topk_group") or 1,
                    moe_router_topk_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)), moe_aux_loss_coeff=0.0)
    # norm_topk_prob false: softmax over all experts, no renormalisation over the top-k
    return dict(moe_router_pre_softmax=not cfg.get("norm_topk_prob", True), moe_router_score_function="softmax",
                moe_aux_loss_coeff=float(cfg.get("router_aux_loss_coef", 0.0)))


def _router_flags(cfg: dict) -> list:
    out = []
    for dest, value in router_settings(cfg).items():
        flag = "--" + dest.replace("_", "-")
        if isinstance(value, bool):
            out += [flag] if value else []
        else:
            out += [flag, _num(value) if isinstance(value, float) else value]
    return out


def moe_layer_pattern_from_hf(cfg: dict) -> list:
    """Per layer 1 (MoE) or 0 (dense), from Qwen-MoE's decoder_sparse_step / mlp_only_layers, DeepSeek / GLM's
    first_k_dense_replace or GLM-4.7-Flash's mlp_layer_types ("dense" / "sparse" per layer)."""
    n, step = cfg["num_hidden_layers"], cfg.get("decoder_sparse_step", 1) or 1
    if isinstance(cfg.get("mlp_layer_types"), list):
        return [1 if t == "sparse" else 0 for t in cfg["mlp_layer_types"]]
    if "first_k_dense_replace" in cfg:
        k = cfg["first_k_dense_replace"]
        return [0] * k + [1] * (n - k)
    dense = set(cfg.get("mlp_only_layers") or [])
    return [1 if (i not in dense and (i + 1) % step == 0) else 0 for i in range(n)]


def _layer_freq_expr(pattern: list) -> str:
    if all(pattern):
        return f"[1]*{len(pattern)}"
    dense = pattern.index(1) if 1 in pattern else len(pattern)
    if all(pattern[dense:]):  # first k dense layers (DeepSeek / GLM's first_k_dense_replace), slime's spelling
        return f"[0]*{dense}+[1]*{len(pattern) - dense}"
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
        yarn = yarn_settings(cfg)
        exp["rotary_scaling_factor"] = yarn["rotary_scaling_factor"]
        if yarn["rotary_scaling_factor"] != 1.0:  # the attention scales mean something only with YaRN
            exp.update(mscale=yarn["mscale"], mscale_all_dim=yarn["mscale_all_dim"])
    n_exp = _num_experts(cfg)
    if n_exp:
        exp.update(num_experts=n_exp, moe_router_topk=cfg["num_experts_per_tok"], moe_ffn_hidden_size=_expert_ffn(cfg))
        if family_of(cfg).shared_expert_gate and cfg.get("shared_expert_intermediate_size"):
            exp["moe_shared_expert_gate"] = True
    if family_of(cfg).linear_attention_spec:
        exp.update(attention_output_gate=True, apply_layernorm_1p=True)
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
        if dest == "attention_output_gate":  # slime passes both spellings; either one turns the gate on
            have = bool(have or args.use_gated_attention)
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
    from slime_like.config.parser import group_of, shared_parser

    parser = shared_parser()
    derived, _ = parser.parse_known_args(model_flags_from_hf(cfg))
    named = set(args.cli_dests)  # a value the user named wins, even one equal to the default (--moe-aux-loss-coeff 0)
    for dest, group in group_of(parser).items():
        default = parser.get_default(dest)
        if group.startswith("model") and getattr(derived, dest) != default and getattr(args, dest) == default \
                and dest not in named:
            setattr(args, dest, getattr(derived, dest))
    # HF decoder LMs train without hidden dropout; Megatron's 0.1 defaults would make the trainer's log-probs
    # differ from the engine's. slime recipes pass both as 0.0 explicitly. A value the user set is kept.
    if args.attention_dropout == parser.get_default("attention_dropout") and "attention_dropout" not in named:
        args.attention_dropout = float(cfg.get("attention_dropout", 0.0))
    if args.hidden_dropout == parser.get_default("hidden_dropout") and "hidden_dropout" not in named:
        args.hidden_dropout = 0.0
    args.model_args_from_hf = True


# dest -> how to read it from config.json, for the model flags whose parser default is None that MODEL_ARGS
# left unset (e.g. a recipe without --vocab-size); fill_model_from_hf sets them all when no MODEL_ARGS are given
_HF_FIELDS = {
    "num_layers": lambda c: c["num_hidden_layers"],
    "hidden_size": lambda c: c["hidden_size"],
    "ffn_hidden_size": lambda c: c["intermediate_size"],
    "num_attention_heads": lambda c: c["num_attention_heads"],
    "kv_channels": lambda c: c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
    "vocab_size": lambda c: c["vocab_size"],
    "max_position_embeddings": lambda c: c.get("max_position_embeddings", 4096),
    "spec": lambda c: list(MINIMAX_M2_SPEC) if family_of(c).qk_norm_across_heads
    else list(family_of(c).linear_attention_spec) or None,
    "num_experts": lambda c: _num_experts(c),
    "moe_ffn_hidden_size": lambda c: _expert_ffn(c) if _num_experts(c) else None,
    "moe_shared_expert_intermediate_size": lambda c: c.get("shared_expert_intermediate_size")
    or c.get("n_shared_experts", 0) * (c.get("moe_intermediate_size") or 0) or None,
}


def _num_experts(cfg: dict):
    return cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")


def _expert_ffn(cfg: dict) -> int:
    """Each expert's FFN width: moe_intermediate_size, or intermediate_size where every MLP is MoE (MiniMax-M2)."""
    return cfg.get("moe_intermediate_size") or cfg["intermediate_size"]


def fill_args_from_hf(args, hf_dir: str):
    """Return a copy of the parsed `args` whose unset model flags come from hf_dir/config.json.

    What the trainer and the conversion tools call (a tool passes `slime_like.args.make_args("--hf-checkpoint",
    hf_dir)`). A Namespace with no model flag at all gets the full HF -> MODEL_ARGS translation
    (fill_model_from_hf); then any model flag still None is read from config.json, and Megatron's derived
    defaults apply.
    """
    cfg = read_hf_config(hf_dir, for_training=True)
    out = copy.copy(args)
    if out.num_layers is None:
        out.hf_checkpoint = hf_dir
        fill_model_from_hf(out)
        if _num_experts(cfg):
            # Megatron's default "allgather" cannot run under PP with variable lengths; slime's MoE recipes
            # use alltoall, and so does a model taken whole from config.json
            out.moe_token_dispatcher_type = "alltoall"
    for name, read in _HF_FIELDS.items():
        if getattr(out, name) is None:
            setattr(out, name, read(cfg))
    if _num_experts(cfg):  # router flags whose parser default is None (group-limited routing) MODEL_ARGS left unset
        for name, value in router_settings(cfg).items():
            if getattr(out, name) is None:
                setattr(out, name, value)
    out.hf_model_type = cfg.get("model_type", "")  # the HF weight layout (hf_names.py), e.g. GLM-4's fused MLP
    if "kv_lora_rank" in cfg:  # YaRN's parts Megatron has no flags for (beta_fast / _slow, original length)
        out.hf_yarn = yarn_settings(cfg)
    out.hf_text_of_vlm = bool(cfg.get("_text_of_vlm"))
    out.hf_sparse_attention = sparse_attention_settings(cfg)
    out.hf_linear_attention = linear_attention_layout(cfg)
    if out.use_rotary_position_embeddings:
        out.position_embedding_type = "rope"
    if not out.group_query_attention:
        out.num_query_groups = out.num_attention_heads
    _, scaling = _rope(cfg)
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3" and not out.use_rope_scaling:
        out.use_rope_scaling, out.rope_scaling_factor = True, float(scaling.get("factor", 8.0))
    return out


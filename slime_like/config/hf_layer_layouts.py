"""The per-layer layouts config.json states beyond the sizes, which megatron-core has no flags for: DeepSeek sparse
attention's indexer, Qwen3-Next / Qwen3.5's gated delta net layers and the multi-token-prediction layers."""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.hf_families import family_of


def sparse_attention_settings(cfg: dict) -> dict | None:
    """DeepSeek sparse attention's indexer from config.json (transformers' defaults where a key is absent): top-k,
    heads, head width, the layers that reuse the previous full layer's top-k (GLM-5's indexer_types "shared"), and
    whether its RoPE rotates interleaved pairs (GLM-5) or halves (DeepSeek-V3.2)."""
    if not family_of(cfg).sparse_attention:
        return None
    glm = cfg.get("model_type") == "glm_moe_dsa"
    types = cfg.get("indexer_types") or (_glm_indexer_types(cfg) if glm else [])
    return {"topk": int(cfg.get("index_topk") or 2048), "n_heads": int(cfg.get("index_n_heads") or (32 if glm else 64)),
            "head_dim": int(cfg.get("index_head_dim") or 128),
            "shared_layers": [i for i, t in enumerate(types) if t == "shared"], "interleaved_rope": glm}


def _glm_indexer_types(cfg: dict) -> list[str]:
    """GlmMoeDsaConfig's derivation where config.json has no indexer_types: index_topk_pattern ("F" / "S" per layer)
    or the index_topk_freq / index_skip_topk_offset schedule (default: every layer full)."""
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq, offset = max(cfg.get("index_topk_freq", 1), 1), cfg.get("index_skip_topk_offset", 2)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(cfg["num_hidden_layers"])]


def linear_attention_layout(cfg: dict) -> dict | None:
    """Qwen3-Next / Qwen3.5's hybrid layout from config.json: which layers are gated delta nets and their sizes
    (megatron-core has flags for neither; slime's spec reads them from config.json as well). None for other models."""
    if "linear_num_value_heads" not in cfg:
        return None
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if not isinstance(types, list):  # older configs: every full_attention_interval-th layer is full attention
        every = int(cfg.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    unknown = sorted(set(types) - {"full_attention", "linear_attention"})
    if len(types) != n or unknown:
        raise ConfigError(f"config.json layer_types: expected {n} entries of full_attention / linear_attention, got "
                          f"{len(types)}" + (f" with {unknown}" if unknown else ""))
    return dict(layer_types=types, num_key_heads=cfg["linear_num_key_heads"],
                num_value_heads=cfg["linear_num_value_heads"], key_head_dim=cfg["linear_key_head_dim"],
                value_head_dim=cfg["linear_value_head_dim"], conv_kernel_dim=cfg.get("linear_conv_kernel_dim", 4))


def declared_mtp_layers(cfg: dict) -> int:
    """The multi-token-prediction layers config.json declares (DeepSeek-V3 / GLM-4.5 / MiMo, MiniMax-M2, Qwen3.5)."""
    return int(cfg.get("num_nextn_predict_layers") or cfg.get("num_mtp_modules") or cfg.get("mtp_num_hidden_layers")
               or 0)


def dropped_mtp_note(cfg: dict, where: str, built: int = 0) -> str | None:
    """What the trainer says when config.json declares MTP layers it does not build (docs/configuration.md);
    None when it builds them all (`built`: --enable-mtp-training's layers)."""
    n = declared_mtp_layers(cfg)
    if not n or built >= n:
        return None
    return (f"{where}: config.json declares {n} multi-token-prediction layer(s); the trainer builds the main model "
            "only, so their tensors are not loaded, not trained and left out of HF exports (engines doing speculative "
            "decoding keep the draft weights they loaded)")

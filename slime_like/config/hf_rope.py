"""config.json's RoPE settings as Megatron sees them: theta and rope_scaling (transformers 5 nests both in
rope_parameters), the rotated fraction of each head, and multi-latent attention's YaRN parameters."""
from __future__ import annotations


def rope_and_scaling(cfg: dict):
    """(theta, rope_scaling dict or None): transformers 5 nests them in rope_parameters."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    return theta, scaling


def partial_rotary(cfg: dict) -> float:
    """Fraction of each head's dims that get RoPE (transformers 5 may keep it in rope_parameters; MiniMax-M2's
    published config.json says rotary_dim instead)."""
    if "partial_rotary_factor" not in cfg and cfg.get("rotary_dim") and cfg.get("head_dim"):
        return cfg["rotary_dim"] / cfg["head_dim"]
    return float(cfg.get("partial_rotary_factor", (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0)))


def yarn_settings(cfg: dict) -> dict:
    """MLA's YaRN RoPE from config.json's rope_scaling, as megatron-core's MLATransformerConfig fields.

    HF leaves `factor` out when it is max_position_embeddings / original_max_position_embeddings; its defaults are
    beta_fast 32, beta_slow 1 (Kimi-K2 publishes 1 and 1: slime's recipes, which cannot pass them, build 32)."""
    _, scaling = rope_and_scaling(cfg)
    if not scaling or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return dict(rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0)
    original = scaling.get("original_max_position_embeddings") or cfg.get("max_position_embeddings", 4096)
    factor = scaling.get("factor") or cfg["max_position_embeddings"] / original
    return dict(rotary_scaling_factor=float(factor), mscale=float(scaling.get("mscale") or 1.0),
                mscale_all_dim=float(scaling.get("mscale_all_dim") or 0.0), original_max_position_embeddings=original,
                beta_fast=float(scaling.get("beta_fast") or 32), beta_slow=float(scaling.get("beta_slow") or 1),
                truncate=bool(scaling.get("truncate", True)))

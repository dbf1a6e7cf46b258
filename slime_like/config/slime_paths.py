"""slime's own functions that recipes name by module path (`--dynamic-sampling-filter-path
slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std`), and where slime_like keeps the same
behaviour. rollout/hooks.py resolves these names; any other `slime.` / `slime_plugins.` path names code that is
not part of slime_like, so the launch refuses it (config/support.py) instead of failing inside a Ray actor.
"""
from __future__ import annotations

ALIASES = {
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std":
        "slime_like.rollout.filters.check_reward_nonzero_std",
    "slime.rollout.sft_rollout.generate_rollout": "slime_like.rollout.sft_rollout.generate_rollout",
    "slime.rollout.forge_load.generate_rollout": "slime_like.rollout.forge_load.generate_rollout",
    "slime.rollout.on_policy_distillation.reward_func": "slime_like.rollout.on_policy_distillation.reward_func",
    "slime.rollout.on_policy_distillation.post_process_rewards":
        "slime_like.rollout.on_policy_distillation.post_process_rewards",
    "slime.rollout.fully_async_rollout.generate_rollout_fully_async":
        "slime_like.rollout.fully_async.generate_rollout_fully_async",
    # slime's default rollout and generate functions (also importable under these names: utils/slime_names.py)
    "slime.rollout.sglang_rollout.generate_rollout": "slime_like.rollout.generate.generate_rollout",
    "slime.rollout.sglang_rollout.generate": "slime_like.rollout.generate_group.generate_sample",
}
FULLY_ASYNC_ROLLOUT = "slime_like.rollout.fully_async.generate_rollout_fully_async"

# slime_like's own functions that a default or an alias above names, with the flags each serves. The preflight
# trusts these without importing them (they need the `rollout` extra: aiohttp, torch), so `--dry-run` runs on the
# light core; tests/config/test_light_dry_run.py imports each and binds it to its flags' call shapes.
OWN_FUNCTIONS = {
    "slime_like.rollout.generate.generate_rollout": ("rollout_function_path", "eval_function_path"),
    "slime_like.rollout.generate_group.generate_sample": ("custom_generate_function_path",),
    "slime_like.rollout.filters.check_reward_nonzero_std": ("dynamic_sampling_filter_path",),
    "slime_like.rollout.sft_rollout.generate_rollout": ("rollout_function_path", "eval_function_path"),
    "slime_like.rollout.forge_load.generate_rollout": ("rollout_function_path", "eval_function_path"),
    "slime_like.rollout.on_policy_distillation.reward_func": ("custom_rm_path",),
    "slime_like.rollout.on_policy_distillation.post_process_rewards": ("custom_reward_post_process_path",),
    FULLY_ASYNC_ROLLOUT: ("rollout_function_path",),
}

# slime's GLM-4 layer spec: mcore's spec with the sandwich norms its flags ask for, which the Megatron trainer builds
# from the same flags (backends/megatron/sandwich.py)
GLM4_SPEC = ("slime_plugins.models.glm4", "get_glm_spec")
# slime's MiniMax-M2 spec: mcore's block spec with a query / key norm over all heads (backends/megatron/qk_norm.py)
MINIMAX_M2_SPEC = ("slime_plugins.models.minimax_m2", "get_minimax_m2_layer_spec")
# slime's Qwen3-Next / Qwen3.5 specs: mcore's block spec with gated delta net layers where config.json's layer_types
# says linear_attention (backends/megatron/linear_attention_spec.py); the flags ask for the gated attention and the
# zero-centred norms of the other layers
QWEN3_NEXT_SPEC = ("slime_plugins.models.qwen3_next", "get_qwen3_next_spec")
QWEN3_5_SPEC = ("slime_plugins.models.qwen3_5", "get_qwen3_5_spec")
LINEAR_ATTENTION_SPECS = (QWEN3_NEXT_SPEC, QWEN3_5_SPEC)
# slime's GLM-5 spec: multi-latent attention with DeepSeek sparse attention's indexer (backends/megatron/dsa.py), which
# the trainer builds for every deepseek_v32 / glm_moe_dsa checkpoint, named or not
GLM5_SPEC = ("slime_plugins.models.glm5.glm5", "get_glm5_spec")
BUILT_SPECS = (GLM4_SPEC, MINIMAX_M2_SPEC, *LINEAR_ATTENTION_SPECS, GLM5_SPEC)


def resolve(path):
    """slime_like's function for one of slime's built-in paths; any other value unchanged."""
    return ALIASES.get(path, path) if isinstance(path, str) else path


def foreign(path) -> bool:
    """A path into slime's own package (or its plugins) that slime_like does not provide."""
    return isinstance(path, str) and path.split(".")[0] in ("slime", "slime_plugins") and path not in ALIASES


def is_fully_async(args) -> bool:
    """The run generates in the background (slime's fully async rollout function is the rollout function)."""
    return resolve(args.rollout_function_path) == FULLY_ASYNC_ROLLOUT

"""Architecture fields of the models' published Hugging Face config.json files (values as published).

Sources: the config.json of each model repository on huggingface.co (Qwen/Qwen2.5-*, Qwen/Qwen3-*,
meta-llama/Llama-3.1-8B, THUDM/GLM-4-9B-0414), plus the tiny model of slime_like.tools.tiny_model.
Keys are the shipped scripts/models/<name>.sh file names.
"""

_Q25 = {"model_type": "qwen2", "hidden_act": "silu", "rope_theta": 1000000.0, "rms_norm_eps": 1e-06}
_Q3 = {"model_type": "qwen3", "hidden_act": "silu", "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
       "head_dim": 128, "vocab_size": 151936, "attention_bias": False}
# Qwen3-Next / Qwen3.5: gated delta net + gated attention (zero-centred norms), RoPE on a quarter of each 256-wide head
_NEXT = {"model_type": "qwen3_next", "hidden_act": "silu", "rope_theta": 10000000, "rms_norm_eps": 1e-06,
         "head_dim": 256, "partial_rotary_factor": 0.25, "attention_bias": False, "norm_topk_prob": True,
         "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.0}


def _qwen3_5(tie, model_type="qwen3_5_text", **text):
    base = {k: v for k, v in _NEXT.items() if k not in ("norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                                                         "router_aux_loss_coef")}
    outer = "qwen3_5_moe" if model_type == "qwen3_5_moe_text" else "qwen3_5"
    return {"model_type": outer, "tie_word_embeddings": tie,
            "text_config": dict(base, model_type=model_type, vocab_size=248320, **text)}


PUBLISHED = {
    "qwen2.5-0.5B": dict(_Q25, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5B": dict(_Q25, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3B": dict(_Q25, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7B": dict(_Q25, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "qwen2.5-14B": dict(_Q25, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40,
                        num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False, rms_norm_eps=1e-05),
    "qwen2.5-32B": dict(_Q25, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                        num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False, rms_norm_eps=1e-05),
    "qwen3-0.6B": dict(_Q3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7B": dict(_Q3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4B": dict(_Q3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8B": dict(_Q3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-14B": dict(_Q3, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-32B": dict(_Q3, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-30B-A3B": dict(_Q3, model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
                          moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                          router_aux_loss_coef=0.001),
    "llama3.1-8B": {"model_type": "llama", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
                    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
                    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
                    "max_position_embeddings": 131072,
                    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
    "glm4-9B": {"model_type": "glm4", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 13696,
                "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
                "vocab_size": 151552, "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "partial_rotary_factor": 0.5,
                "attention_bias": True, "tie_word_embeddings": False},
    # GLM-4.5-Air: transformers' Glm4MoeConfig defaults (its docstring's GLM-4.5-Air architecture) with the published
    # values the defaults lack (attention_bias, rope_theta 1e6, head_dim 128); every value cross-checked with slime's
    # scripts/models/glm4.5-106B-A12B.sh at 624b824
    "glm4.5-106B-A12B": {"model_type": "glm4_moe", "hidden_act": "silu", "hidden_size": 4096,
                         "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 46,
                         "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151552,
                         "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "partial_rotary_factor": 0.5,
                         "attention_bias": True, "use_qk_norm": False, "tie_word_embeddings": False,
                         "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8,
                         "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
                         "norm_topk_prob": True, "num_nextn_predict_layers": 1},
    # GLM-4.5 (355B-A32B): the values of slime's scripts/models/glm4.5-355B-A32B.sh at 624b824 (3 dense + 89 MoE
    # layers, 160 experts, qk-norm, routed_scaling_factor 2.5) in config.json keys
    "glm4.5-355B-A32B": {"model_type": "glm4_moe", "hidden_act": "silu", "hidden_size": 5120,
                         "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 92,
                         "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151552,
                         "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "partial_rotary_factor": 0.5,
                         "attention_bias": True, "use_qk_norm": True, "tie_word_embeddings": False,
                         "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8,
                         "first_k_dense_replace": 3, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
                         "norm_topk_prob": True, "num_nextn_predict_layers": 1},
    # DeepSeek-V3 (and R1, same architecture): transformers' DeepseekV3Config defaults (its docstring's DeepSeek-V3)
    # with the published YaRN rope_scaling; cross-checked with slime's scripts/models/deepseek-v3.sh at 624b824
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "head_dim": 64, "vocab_size": 129280,
                    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": False,
                    "attention_bias": False, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4,
                    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "rope_interleave": True,
                    "num_nextn_predict_layers": 1, "max_position_embeddings": 163840,
                    "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                     "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}},
    # moonshotai/Kimi-K2-Instruct (model_type kimi_k2 over DeepseekV3ForCausalLM; its YaRN has beta_fast = beta_slow
    # = 1); cross-checked with slime's scripts/models/kimi-k2.sh at 624b824
    "kimi-k2": {"model_type": "kimi_k2", "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
                "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
                "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840, "rms_norm_eps": 1e-06,
                "rope_theta": 50000.0, "tie_word_embeddings": False, "attention_bias": False,
                "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827, "norm_topk_prob": True,
                "num_nextn_predict_layers": 0, "max_position_embeddings": 131072,
                "rope_scaling": {"type": "yarn", "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                 "original_max_position_embeddings": 4096, "beta_fast": 1.0, "beta_slow": 1.0}},
    # MiniMaxAI/MiniMax-M2 (M2.5 shares the architecture): its published config.json; cross-checked with slime's
    # scripts/models/minimax-m2.sh at 624b824 (per_layer qk-norm, rotary_dim 64 of head_dim 128, MTP modules unused)
    "minimax-m2": {"model_type": "minimax_m2", "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
                   "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
                   "rotary_dim": 64, "rope_theta": 5000000, "vocab_size": 200064, "rms_norm_eps": 1e-06,
                   "tie_word_embeddings": False, "num_local_experts": 256, "num_experts_per_tok": 8,
                   "scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True,
                   "qk_norm_type": "per_layer", "shared_intermediate_size": 0, "max_position_embeddings": 196608,
                   "router_aux_loss_coef": 0.001},
    # moonshotai/Moonlight-16B-A3B (model_type deepseek_v3, no q low rank, no RoPE scaling): the values of slime's
    # scripts/models/moonlight.sh at 624b824 in config.json keys
    "moonlight-16B-A3B": {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 2048,
                          "intermediate_size": 11264, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
                          "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": None,
                          "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                          "vocab_size": 163840, "rms_norm_eps": 1e-05, "rope_theta": 50000.0,
                          "tie_word_embeddings": False, "attention_bias": False, "n_routed_experts": 64,
                          "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "n_group": 1,
                          "topk_group": 1, "routed_scaling_factor": 2.446, "norm_topk_prob": True,
                          "rope_interleave": True, "rope_scaling": None},
    # XiaomiMiMo/MiMo-7B-RL (model_type mimo: Qwen2 + 1 MTP layer, dropped): the values of slime's
    # scripts/models/mimo-7B-rl.sh in config.json keys
    "mimo-7B-RL": {"model_type": "mimo", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
                   "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 151680,
                   "rope_theta": 640000, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
                   "max_position_embeddings": 32768, "num_nextn_predict_layers": 1},
    # zai-org/GLM-4.7-Flash (model_type glm4_moe_lite): transformers' Glm4MoeLiteConfig defaults (its published sizes)
    # with the 47 layers and rope_theta 1e6 of slime's scripts/models/glm4.7-30B-A3B.sh
    "glm4.7-30B-A3B": {"model_type": "glm4_moe_lite", "hidden_act": "silu", "hidden_size": 2048,
                       "intermediate_size": 10240, "moe_intermediate_size": 1536, "num_hidden_layers": 47,
                       "num_attention_heads": 20, "num_key_value_heads": 20, "q_lora_rank": 768, "kv_lora_rank": 512,
                       "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256, "vocab_size": 154880,
                       "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "tie_word_embeddings": False,
                       "attention_bias": False, "n_routed_experts": 64, "n_shared_experts": 1, "num_experts_per_tok": 4,
                       "mlp_layer_types": ["dense"] + ["sparse"] * 46, "n_group": 1, "topk_group": 1,
                       "routed_scaling_factor": 1.8, "norm_topk_prob": True, "rope_interleave": True,
                       "max_position_embeddings": 202752},
    # Qwen/Qwen3-Next-80B-A3B (model_type qwen3_next): the values of slime's scripts/models/qwen3-next-80B-A3B.sh at
    # 624b824 in config.json keys (its --moe-aux-loss-coeff 0 as router_aux_loss_coef)
    "qwen3-next-80B-A3B": dict(_NEXT, hidden_size=2048, intermediate_size=5120, num_hidden_layers=48,
                               num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                               tie_word_embeddings=False, num_experts=512, num_experts_per_tok=10,
                               moe_intermediate_size=512, shared_expert_intermediate_size=512),
    # Qwen/Qwen3.5-* (vision-language checkpoints: the text model under text_config, model_type qwen3_5_text /
    # qwen3_5_moe_text; tie_word_embeddings at the top level): the values of slime's scripts/models/qwen3.5-*.sh at
    # 624b824 in config.json keys. The MoE text config has no intermediate_size (slime passes the expert size)
    "qwen3.5-0.8B": _qwen3_5(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                             num_key_value_heads=2, tie=True),
    "qwen3.5-4B": _qwen3_5(hidden_size=2560, intermediate_size=9216, num_hidden_layers=32, num_attention_heads=16,
                           num_key_value_heads=4, tie=True),
    "qwen3.5-9B": _qwen3_5(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
                           num_key_value_heads=4, tie=False),
    "qwen3.5-27B": _qwen3_5(hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
                            num_key_value_heads=4, tie=False),
    "qwen3.5-35B-A3B": _qwen3_5(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                                tie=False, model_type="qwen3_5_moe_text", num_experts=256, num_experts_per_tok=8,
                                moe_intermediate_size=512, shared_expert_intermediate_size=512,
                                router_aux_loss_coef=0.0),
    # slime_like.tools.tiny_model.build_tiny_checkpoint() defaults
    "tiny-qwen2": {"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
                   "rope_theta": 10000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": True},
}

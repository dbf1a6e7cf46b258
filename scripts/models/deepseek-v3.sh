# deepseek-ai/DeepSeek-V3 (R1 shares it): values of its published config.json (tests/config/published_configs.py; regenerate:
# python -m slime_like.tools.model_args DIR). Its MTP layer is not loaded: see docs/configuration.md
MODEL_ARGS=(
   --swiglu
   --num-layers 61
   --hidden-size 7168
   --ffn-hidden-size 18432
   --num-attention-heads 128
   --multi-latent-attention
   --kv-lora-rank 512
   --qk-head-dim 128
   --qk-pos-emb-head-dim 64
   --v-head-dim 128
   --qk-layernorm
   --q-lora-rank 1536
   --rotary-scaling-factor 40.0
   --mscale 1.0
   --mscale-all-dim 1.0
   --use-rotary-position-embeddings
   --disable-bias-linear
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --rotary-base 10000
   --vocab-size 129280
   --untie-embeddings-and-output-weights
   --num-experts 256
   --moe-router-topk 8
   --moe-ffn-hidden-size 2048
   --moe-layer-freq "[0]*3+[1]*58"
   --moe-shared-expert-intermediate-size 2048
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-bias-update-rate 0.0
   --moe-router-num-groups 8
   --moe-router-group-topk 4
   --moe-router-topk-scaling-factor 2.5
   --moe-aux-loss-coeff 0.0
)

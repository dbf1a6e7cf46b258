# moonshotai/Kimi-K2-Instruct (model_type kimi_k2, DeepSeek-V3's architecture): values of its published config.json
# (tests/config/published_configs.py; regenerate: python -m slime_like.tools.model_args DIR). Its YaRN beta_fast /
# beta_slow (1 / 1) have no Megatron flag: the trainer reads them from --hf-checkpoint's config.json
MODEL_ARGS=(
   --swiglu
   --num-layers 61
   --hidden-size 7168
   --ffn-hidden-size 18432
   --num-attention-heads 64
   --multi-latent-attention
   --kv-lora-rank 512
   --qk-head-dim 128
   --qk-pos-emb-head-dim 64
   --v-head-dim 128
   --qk-layernorm
   --q-lora-rank 1536
   --rotary-scaling-factor 32.0
   --mscale 1.0
   --mscale-all-dim 1.0
   --use-rotary-position-embeddings
   --disable-bias-linear
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --rotary-base 50000
   --vocab-size 163840
   --untie-embeddings-and-output-weights
   --num-experts 384
   --moe-router-topk 8
   --moe-ffn-hidden-size 2048
   --moe-layer-freq "[0]*1+[1]*60"
   --moe-shared-expert-intermediate-size 2048
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-bias-update-rate 0.0
   --moe-router-num-groups 1
   --moe-router-group-topk 1
   --moe-router-topk-scaling-factor 2.827
   --moe-aux-loss-coeff 0.0
)

# moonshotai/Moonlight-16B-A3B: values of its published config.json (tests/config/published_configs.py; regenerate:
# python -m slime_like.tools.model_args DIR). Its MTP layer is not loaded: see docs/configuration.md
MODEL_ARGS=(
   --swiglu
   --num-layers 27
   --hidden-size 2048
   --ffn-hidden-size 11264
   --num-attention-heads 16
   --multi-latent-attention
   --kv-lora-rank 512
   --qk-head-dim 128
   --qk-pos-emb-head-dim 64
   --v-head-dim 128
   --qk-layernorm
   --rotary-scaling-factor 1.0
   --use-rotary-position-embeddings
   --disable-bias-linear
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --rotary-base 50000
   --vocab-size 163840
   --untie-embeddings-and-output-weights
   --num-experts 64
   --moe-router-topk 6
   --moe-ffn-hidden-size 1408
   --moe-layer-freq "[0]*1+[1]*26"
   --moe-shared-expert-intermediate-size 2816
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-bias-update-rate 0.0
   --moe-router-num-groups 1
   --moe-router-group-topk 1
   --moe-router-topk-scaling-factor 2.446
   --moe-aux-loss-coeff 0.0
)

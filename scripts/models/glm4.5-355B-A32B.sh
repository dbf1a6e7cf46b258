# zai-org/GLM-4.5: values of its published config.json (tests/config/published_configs.py; regenerate:
# python -m slime_like.tools.model_args DIR). Its MTP layer is not loaded: see docs/configuration.md
MODEL_ARGS=(
   --swiglu
   --num-layers 92
   --hidden-size 5120
   --ffn-hidden-size 12288
   --num-attention-heads 96
   --group-query-attention
   --num-query-groups 8
   --kv-channels 128
   --use-rotary-position-embeddings
   --disable-bias-linear
   --add-qkv-bias
   --qk-layernorm
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --rotary-base 1000000
   --rotary-percent 0.5
   --vocab-size 151552
   --untie-embeddings-and-output-weights
   --num-experts 160
   --moe-router-topk 8
   --moe-ffn-hidden-size 1536
   --moe-layer-freq "[0]*3+[1]*89"
   --moe-shared-expert-intermediate-size 1536
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-bias-update-rate 0.0
   --moe-router-num-groups 1
   --moe-router-group-topk 1
   --moe-router-topk-scaling-factor 2.5
   --moe-aux-loss-coeff 0.0
)

# MiniMaxAI/MiniMax-M2 (M2.5 shares the architecture): values of its published config.json (tests/config/published_configs.py;
# regenerate: python -m slime_like.tools.model_args DIR). --spec names slime's plugin for the query / key norm over all
# heads, which the trainer builds itself (backends/megatron/qk_norm.py). Its MTP modules are not loaded
MODEL_ARGS=(
   --swiglu
   --num-layers 62
   --hidden-size 3072
   --ffn-hidden-size 1536
   --num-attention-heads 48
   --group-query-attention
   --num-query-groups 8
   --kv-channels 128
   --use-rotary-position-embeddings
   --disable-bias-linear
   --qk-layernorm
   --spec slime_plugins.models.minimax_m2 get_minimax_m2_layer_spec
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --rotary-base 5000000
   --rotary-percent 0.5
   --vocab-size 200064
   --untie-embeddings-and-output-weights
   --num-experts 256
   --moe-router-topk 8
   --moe-ffn-hidden-size 1536
   --moe-layer-freq "[1]*62"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-bias-update-rate 0.0
   --moe-router-num-groups 1
   --moe-router-group-topk 1
   --moe-router-topk-scaling-factor 1.0
   --moe-aux-loss-coeff 0.0
)

# Qwen/Qwen3-30B-A3B: values from its published config.json (regenerate: python -m slime_like.tools.model_args DIR)
MODEL_ARGS=(
   --swiglu
   --num-layers 48
   --hidden-size 2048
   --ffn-hidden-size 6144
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 4
   --kv-channels 128
   --use-rotary-position-embeddings
   --disable-bias-linear
   --qk-layernorm
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --rotary-base 1000000
   --vocab-size 151936
   --untie-embeddings-and-output-weights
   --num-experts 128
   --moe-router-topk 8
   --moe-ffn-hidden-size 768
   --moe-layer-freq "[1]*48"
   --moe-router-score-function softmax
   --moe-aux-loss-coeff 0.001
)

# Qwen/Qwen3-0.6B: values from its published config.json (regenerate: python -m slime_like.tools.model_args DIR)
MODEL_ARGS=(
   --swiglu
   --num-layers 28
   --hidden-size 1024
   --ffn-hidden-size 3072
   --num-attention-heads 16
   --group-query-attention
   --num-query-groups 8
   --kv-channels 128
   --use-rotary-position-embeddings
   --disable-bias-linear
   --qk-layernorm
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --rotary-base 1000000
   --vocab-size 151936
)

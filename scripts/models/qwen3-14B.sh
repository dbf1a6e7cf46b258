# Qwen/Qwen3-14B: values from its published config.json (regenerate: python -m slime_like.tools.model_args DIR)
MODEL_ARGS=(
   --swiglu
   --num-layers 40
   --hidden-size 5120
   --ffn-hidden-size 17408
   --num-attention-heads 40
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
   --untie-embeddings-and-output-weights
)

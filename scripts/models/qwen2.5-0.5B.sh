# Qwen/Qwen2.5-0.5B: values from its published config.json (regenerate: python -m slime_like.tools.model_args DIR)
MODEL_ARGS=(
   --swiglu
   --num-layers 24
   --hidden-size 896
   --ffn-hidden-size 4864
   --num-attention-heads 14
   --group-query-attention
   --num-query-groups 2
   --use-rotary-position-embeddings
   --disable-bias-linear
   --add-qkv-bias
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --rotary-base 1000000
   --vocab-size 151936
)

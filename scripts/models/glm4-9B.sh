# THUDM/GLM-4-9B-0414: values from its published config.json (regenerate: python -m slime_like.tools.model_args DIR)
MODEL_ARGS=(
   --swiglu
   --num-layers 40
   --hidden-size 4096
   --ffn-hidden-size 13696
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 2
   --use-rotary-position-embeddings
   --disable-bias-linear
   --add-qkv-bias
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --rotary-base 10000
   --rotary-percent 0.5
   --post-self-attn-layernorm
   --post-mlp-layernorm
   --rotary-interleaved
   --no-rope-fusion
   --vocab-size 151552
   --untie-embeddings-and-output-weights
)

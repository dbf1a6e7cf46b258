# meta-llama/Llama-3.1-8B: values from its published config.json (regenerate: python -m slime_like.tools.model_args DIR)
MODEL_ARGS=(
   --swiglu
   --num-layers 32
   --hidden-size 4096
   --ffn-hidden-size 14336
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 8
   --use-rotary-position-embeddings
   --disable-bias-linear
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --rotary-base 500000
   --use-rope-scaling
   --rope-scaling-factor 8.0
   --vocab-size 128256
   --untie-embeddings-and-output-weights
)

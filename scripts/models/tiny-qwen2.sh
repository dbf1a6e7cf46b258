# Tiny Qwen2 of slime_like.tools.tiny_model (build_tiny_checkpoint defaults), used by the tests (not the demo's model: slime_like.demo.prepare builds that one, hidden 128, char tokenizer).
MODEL_ARGS=(
   --swiglu
   --num-layers 2
   --hidden-size 64
   --ffn-hidden-size 128
   --num-attention-heads 4
   --group-query-attention
   --num-query-groups 2
   --use-rotary-position-embeddings
   --disable-bias-linear
   --add-qkv-bias
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --rotary-base 10000
   --vocab-size 128
)

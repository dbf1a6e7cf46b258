# XiaomiMiMo/MiMo-7B-RL (model_type mimo: Qwen2's main model): values of slime's scripts/models/mimo-7B-rl.sh
# (tests/config/published_configs.py; regenerate: python -m slime_like.tools.model_args DIR). Its MTP layer is not
# loaded (slime's file adds --mtp-num-layers 1, which here warns that it has no effect): see docs/configuration.md
MODEL_ARGS=(
   --swiglu
   --num-layers 36
   --hidden-size 4096
   --ffn-hidden-size 11008
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 8
   --use-rotary-position-embeddings
   --disable-bias-linear
   --add-qkv-bias
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --rotary-base 640000
   --vocab-size 151680
   --untie-embeddings-and-output-weights
)

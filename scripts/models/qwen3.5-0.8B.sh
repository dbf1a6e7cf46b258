# Qwen/Qwen3.5-0.8B (model_type qwen3_5, a vision-language checkpoint: its text model trains): values of slime's scripts/models/qwen3.5-0.8B.sh
# (tests/config/published_configs.py; regenerate: python -m slime_like.tools.model_args DIR). The gated delta net's
# sizes and layer_types are read from --hf-checkpoint's config.json, as slime's spec reads them: see docs/configuration.md
MODEL_ARGS=(
   --swiglu
   --num-layers 24
   --hidden-size 1024
   --ffn-hidden-size 3584
   --num-attention-heads 8
   --group-query-attention
   --num-query-groups 2
   --kv-channels 256
   --use-rotary-position-embeddings
   --disable-bias-linear
   --qk-layernorm
   --spec slime_plugins.models.qwen3_5 get_qwen3_5_spec
   --attention-output-gate
   --use-gated-attention
   --apply-layernorm-1p
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --rotary-base 10000000
   --rotary-percent 0.25
   --vocab-size 248320
)

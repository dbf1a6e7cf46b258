# zai-org/GLM-4.7-Flash (model_type glm4_moe_lite: DeepSeek-V3's MLA + GLM-4.5's router): values of
# tests/config/published_configs.py (regenerate: python -m slime_like.tools.model_args DIR)
MODEL_ARGS=(
   --swiglu
   --num-layers 47
   --hidden-size 2048
   --ffn-hidden-size 10240
   --num-attention-heads 20
   --multi-latent-attention
   --kv-lora-rank 512
   --qk-head-dim 192
   --qk-pos-emb-head-dim 64
   --v-head-dim 256
   --qk-layernorm
   --q-lora-rank 768
   --rotary-scaling-factor 1.0
   --use-rotary-position-embeddings
   --disable-bias-linear
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --rotary-base 1000000
   --vocab-size 154880
   --untie-embeddings-and-output-weights
   --num-experts 64
   --moe-router-topk 4
   --moe-ffn-hidden-size 1536
   --moe-layer-freq "[0]*1+[1]*46"
   --moe-shared-expert-intermediate-size 1536
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-bias-update-rate 0.0
   --moe-router-num-groups 1
   --moe-router-group-topk 1
   --moe-router-topk-scaling-factor 1.8
   --moe-aux-loss-coeff 0.0
)

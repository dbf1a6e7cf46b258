#!/usr/bin/env bash
# PPO on Qwen2.5-7B with a critic, one node of 8 GPUs, disaggregated: actor 4 GPUs, critic 2, engines 2.
# Per-role learning rates come from scripts/configs/ppo.yaml (--megatron-config-path; see docs/configuration.md).
#   HF_CKPT=/models/Qwen2.5-7B bash scripts/run-qwen2.5-7B-ppo.sh --dry-run
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/models/qwen2.5-7B.sh"

HF_CKPT=${HF_CKPT:-/root/Qwen2.5-7B}
REF_LOAD=${REF_LOAD:-/root/Qwen2.5-7B_torch_dist}
SAVE_DIR=${SAVE_DIR:-/root/Qwen2.5-7B_slime_like_ppo}
PROMPT_DATA=${PROMPT_DATA:-/root/dapo-math-17k/dapo-math-17k.jsonl}

CKPT_ARGS=(--hf-checkpoint "${HF_CKPT}" --ref-load "${REF_LOAD}" --load "${SAVE_DIR}" --save "${SAVE_DIR}"
           --save-interval 20)
ROLLOUT_ARGS=(--prompt-data "${PROMPT_DATA}" --input-key prompt --label-key label --apply-chat-template
              --rollout-shuffle --rm-type deepscaler --num-rollout 3000 --rollout-batch-size 32
              --n-samples-per-prompt 4 --rollout-max-response-len 8192 --rollout-temperature 1
              --num-steps-per-rollout 2)
PERF_ARGS=(--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 1
           --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 1
           --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
           --use-dynamic-batch-size --max-tokens-per-gpu 9216)
PPO_ARGS=(--advantage-estimator ppo --use-critic --megatron-config-path "${SCRIPT_DIR}/configs/ppo.yaml"
          --gamma 1.0 --lambd 0.95 --value-clip 0.2 --eps-clip 0.2 --eps-clip-high 0.28
          --use-kl-loss --kl-loss-coef 0.001 --kl-loss-type low_var_kl --num-critic-only-steps 0)
OPTIMIZER_ARGS=(--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1
                --adam-beta1 0.9 --adam-beta2 0.98)
SGLANG_ARGS=(--rollout-num-gpus 2 --rollout-num-gpus-per-engine 2 --sglang-mem-fraction-static 0.8)
MISC_ARGS=(--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32)

source "${SCRIPT_DIR}/lib/launch_train.sh"   # LAUNCH=ray: local Ray head + `ray job submit`
launch_train \
   --actor-num-nodes 1 --actor-num-gpus-per-node 4 --critic-num-nodes 1 --critic-num-gpus-per-node 2 \
   "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${PERF_ARGS[@]}" \
   "${PPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${SGLANG_ARGS[@]}" "${MISC_ARGS[@]}" "$@"

#!/usr/bin/env bash
# GRPO on Qwen2.5-7B (DAPO math data), one node of 8 GPUs, trainer and engines colocated -- slime's recipe layout.
# Paths come from the environment; any extra flag is appended, e.g.
#   HF_CKPT=/models/Qwen2.5-7B bash scripts/run-qwen2.5-7B-grpo.sh --dry-run
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/models/qwen2.5-7B.sh"

HF_CKPT=${HF_CKPT:-/root/Qwen2.5-7B}
REF_LOAD=${REF_LOAD:-/root/Qwen2.5-7B_torch_dist}
SAVE_DIR=${SAVE_DIR:-/root/Qwen2.5-7B_slime_like_grpo}
PROMPT_DATA=${PROMPT_DATA:-/root/dapo-math-17k/dapo-math-17k.jsonl}
EVAL_DATA=${EVAL_DATA:-/root/aime-2024/aime-2024.jsonl}

CKPT_ARGS=(--hf-checkpoint "${HF_CKPT}" --ref-load "${REF_LOAD}" --load "${SAVE_DIR}" --save "${SAVE_DIR}"
           --save-interval 20)
ROLLOUT_ARGS=(--prompt-data "${PROMPT_DATA}" --input-key prompt --label-key label --apply-chat-template
              --rollout-shuffle --rm-type deepscaler --num-rollout 3000 --rollout-batch-size 32
              --n-samples-per-prompt 8 --rollout-max-response-len 8192 --rollout-temperature 1
              --global-batch-size 256 --balance-data)
EVAL_ARGS=(--eval-interval 20 --eval-prompt-data aime "${EVAL_DATA}" --n-samples-per-eval-prompt 16
           --eval-max-response-len 16384 --eval-top-p 1)
PERF_ARGS=(--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 1
           --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 1
           --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
           --use-dynamic-batch-size --max-tokens-per-gpu 9216)
GRPO_ARGS=(--advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl
           --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28)
OPTIMIZER_ARGS=(--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1
                --adam-beta1 0.9 --adam-beta2 0.98)
SGLANG_ARGS=(--rollout-num-gpus-per-engine 2 --sglang-mem-fraction-static 0.7)
MISC_ARGS=(--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
           --attention-softmax-in-fp32 --attention-backend flash)

source "${SCRIPT_DIR}/lib/launch_train.sh"   # LAUNCH=ray: local Ray head + `ray job submit`
launch_train \
   --actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate \
   "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" "${PERF_ARGS[@]}" \
   "${GRPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${SGLANG_ARGS[@]}" "${MISC_ARGS[@]}" "$@"

#!/usr/bin/env bash
# The CPU demo: real RL post-training with the whole stack on a laptop-class CPU, no GPU, no download.
#
#   bash scripts/run-demo.sh [RUN_DIR [extra train.py flags ...]]        (default runs/demo)
#
# 1. builds a tiny Qwen2-architecture model + character tokenizer and a 2-digit addition task, and warms the
#    model up with a short SFT (skipped when RUN_DIR/task already has them);
# 2. runs GRPO with train.py: Ray places a megatron-core trainer and the embedded CPU engine (SGLang's HTTP
#    API) colocated on one declared GPU slot; the held-out greedy accuracy is measured before the first
#    update and every 10 rollouts;
# 3. writes RUN_DIR/metrics.jsonl and RUN_DIR/learning_curve.png and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${1:-runs/demo}
shift || true   # the rest goes to train.py (e.g. --lr 1e-4 --num-rollout 80)
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TASK=$RUN_DIR/task
NUM_ROLLOUT=${NUM_ROLLOUT:-160}
LR=${LR:-2e-4}

$PY -m slime_like.demo.prepare "$TASK"
rm -f "$RUN_DIR/metrics.jsonl"   # a fresh curve each run (the task and warm-up are reused)

$PY train.py \
  --hf-checkpoint "$TASK/sft_model" \
  --prompt-data "$TASK/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle \
  --custom-rm-path slime_like.demo.arith.reward \
  --num-rollout "$NUM_ROLLOUT" --rollout-batch-size 64 --n-samples-per-prompt 8 \
  --rollout-max-response-len 5 --rollout-temperature 1 \
  --advantage-estimator grpo --lr "$LR" --lr-decay-style cosine --min-lr 5e-5 --clip-grad 1.0 --micro-batch-size 128 \
  --eval-prompt-data arith "$TASK/data/heldout.jsonl" --eval-interval 10 \
  --n-samples-per-eval-prompt 1 --eval-temperature 0 --eval-max-response-len 5 \
  --colocate --actor-num-nodes 1 --actor-num-gpus-per-node 1 --num-gpus-per-node 1 \
  --run-dir "$RUN_DIR" "$@"

$PY -m slime_like.utils.plot "$RUN_DIR"
$PY -m slime_like.demo.summary "$RUN_DIR"

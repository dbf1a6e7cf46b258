#!/usr/bin/env bash
# The CPU demo: real RL post-training with the whole stack on a laptop-class CPU, no GPU, no download.
#
#   bash scripts/run-demo.sh [RUN_DIR [extra train.py flags ...]]        (default runs/demo)
#
# The same as `slime-like demo RUN_DIR ...` from an installed package (slime_like/demo/run.py):
# 1. builds a tiny Qwen2-architecture model + character tokenizer and a 2-digit addition task, and warms the
#    model up with a short SFT (skipped when RUN_DIR/task already has them);
# 2. runs GRPO with the synchronous loop of train.py: Ray places a megatron-core trainer and the embedded CPU
#    engine (SGLang's HTTP API) colocated on one declared GPU slot; the held-out greedy accuracy is measured
#    before the first update and every 10 rollouts;
# 3. ends with the run's summary (RUN_DIR/metrics.jsonl, RUN_DIR/learning_curve.png, first vs last eval).
# NUM_ROLLOUT=N and LR=X in the environment change the number of rollouts (160) and the learning rate (2e-4).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${1:-runs/demo}
shift || true   # the rest goes to the trainer (e.g. --lr 1e-4 --num-rollout 80)
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
ENV_FLAGS=()
[ -n "${NUM_ROLLOUT:-}" ] && ENV_FLAGS+=(--num-rollout "$NUM_ROLLOUT")
[ -n "${LR:-}" ] && ENV_FLAGS+=(--lr "$LR")
exec $PY -m slime_like demo "$RUN_DIR" "${ENV_FLAGS[@]}" "$@"

#!/usr/bin/env bash
# The visual CPU demo: a tiny vision-language model learns to count shapes in pictures with GRPO, on a CPU.
#
#   bash scripts/run-demo-vlm.sh [RUN_DIR [extra train.py flags ...]]        (default runs/demo_vlm)
#
# The same as `slime-like demo-vlm RUN_DIR ...` from an installed package (slime_like/demo/vlm_run.py; docs/demo.md
# "The visual demo").
# 1. draws the task (84x84 pictures with 1-9 shapes, "<image>How many shapes?" -> the count, slime's multimodal
#    jsonl with an "images" key), builds a tiny random Qwen2.5-VL and warms it up with a short SFT to ~25 %
#    held-out accuracy (skipped when RUN_DIR/task already has them);
# 2. runs GRPO with the synchronous loop of train.py: Ray places the FSDP trainer and the embedded CPU engine
#    (images sent as SGLang's image_data) colocated on one declared GPU slot; the held-out greedy accuracy is
#    measured before the first update and every 10 rollouts;
# 3. ends with the run's summary (RUN_DIR/metrics.jsonl, RUN_DIR/learning_curve.png, first vs last eval).
# NUM_ROLLOUT=N and LR=X in the environment change the number of rollouts and the learning rate.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${1:-runs/demo_vlm}
shift || true   # the rest goes to the trainer (e.g. --lr 5e-4 --num-rollout 40)
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
ENV_FLAGS=()
[ -n "${NUM_ROLLOUT:-}" ] && ENV_FLAGS+=(--num-rollout "$NUM_ROLLOUT")
[ -n "${LR:-}" ] && ENV_FLAGS+=(--lr "$LR")
exec $PY -m slime_like demo-vlm "$RUN_DIR" "${ENV_FLAGS[@]}" "$@"

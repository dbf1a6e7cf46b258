#!/usr/bin/env bash
# On-policy distillation on the CPU demo task, next to GRPO from the same start (docs/demo.md "Distillation that
# beats GRPO"):
#
#   bash scripts/run-demo-opd.sh [RUN_DIR [extra train.py flags for both runs ...]]     (default runs/demo_opd)
#
# 1. builds the demo task, its 15 % SFT warm-up (the student) and a teacher: the same base model SFT'd further,
#    to about 60 % held-out accuracy (RUN_DIR/task, reused when it exists);
# 2. RUN_DIR/opd: pure distillation with train.py - zero task reward, the exact reverse KL to the teacher over
#    the whole vocabulary (--opd-kl-mode full), one sample for each of 512 prompts per rollout, lr 1e-3;
# 3. RUN_DIR/grpo: the demo's GRPO (64 prompts x 8 samples, lr 2e-4 cosine), the same 512 samples per rollout
#    (skipped with GRPO=0);
# 4. RUN_DIR/opd_vs_grpo.png: both held-out accuracy curves and the teacher's.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${1:-runs/demo_opd}
shift || true
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export NUM_ROLLOUT=${NUM_ROLLOUT:-100}

$PY -m slime_like.demo.prepare "$RUN_DIR/task" --teacher-target 0.6
for run in opd grpo; do   # run-demo.sh finds the task in RUN/task
    mkdir -p "$RUN_DIR/$run"
    ln -sfn ../task "$RUN_DIR/$run/task"
done

LR=1e-3 bash scripts/run-demo.sh "$RUN_DIR/opd" \
  --use-opd --opd-type megatron --opd-teacher-load "$RUN_DIR/task/teacher_model" --opd-kl-mode full \
  --custom-reward-post-process-path slime_like.demo.arith.distill_only_rewards \
  --rollout-batch-size 512 --n-samples-per-prompt 1 --lr-decay-style constant --lr-warmup-iters 10 "$@"
runs=("pure distillation=$RUN_DIR/opd")
if [ "${GRPO:-1}" != 0 ]; then
  bash scripts/run-demo.sh "$RUN_DIR/grpo" "$@"
  runs+=("GRPO=$RUN_DIR/grpo")
fi

teacher=$($PY -c "import json, sys; print(json.load(open(sys.argv[1]))['heldout_accuracy'])" \
  "$RUN_DIR/task/teacher_model/sft_result.json")
$PY -m slime_like.utils.plot --compare "${runs[@]}" --line "teacher=$teacher" --out "$RUN_DIR/opd_vs_grpo.png"

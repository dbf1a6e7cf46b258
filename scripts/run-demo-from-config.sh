#!/usr/bin/env bash
# The CPU demo (docs/demo.md) driven by an RLinf or a ROLL config file instead of flags.
#
#   bash scripts/run-demo-from-config.sh rlinf|roll [colocated|disaggregated] [RUN_DIR [extra overrides/flags ...]]
#
# Prepares the task (shared with scripts/run-demo.sh), writes ROLL's JSON-array data files with its
# ground_truth column, runs train.py --config scripts/configs/{rlinf-demo-grpo,roll-demo-rlvr}.yaml with the
# held-out eval greedy (--eval-temperature 0 after the file: our flags win) and prints the summary
# (RLinf file: 100 steps; ROLL file: 160 steps, as scripts/run-demo.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
FORMAT=${1:?rlinf or roll}
LAYOUT=${2:-colocated}
RUN_DIR=${3:-runs/${FORMAT}-demo-${LAYOUT}}
shift $(( $# < 3 ? $# : 3 ))
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DEMO_TASK=${DEMO_TASK:-runs/demo/task} DEMO_RUN=$RUN_DIR
$PY -m slime_like.demo.prepare "$DEMO_TASK"
rm -f "$RUN_DIR/metrics.jsonl"

EXTRA=()
case "$FORMAT" in
  rlinf)
    CONFIG=scripts/configs/rlinf-demo-grpo.yaml
    SPLIT=(cluster.num_gpus_per_node=2 "cluster.component_placement={actor: 0, rollout: 1}") ;;
  roll)
    CONFIG=scripts/configs/roll-demo-rlvr.yaml
    SPLIT=(num_gpus_per_node=2 "actor_infer.device_mapping=[1]")
    EXTRA=(--min-lr 5e-5)  # the demo's cosine floor; ROLL's file has no key for it
    for name in train heldout; do  # ROLL reads JSON arrays with the answer in ground_truth
      $PY -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
json.dump([{"prompt": r["prompt"], "ground_truth": r["label"]} for r in rows], open(sys.argv[2], "w"))' \
        "$DEMO_TASK/data/$name.jsonl" "$DEMO_TASK/data/$name.json"
    done ;;
  *) echo "format must be rlinf or roll" >&2; exit 2 ;;
esac
LAYOUT_ARGS=()
[ "$LAYOUT" = disaggregated ] && LAYOUT_ARGS=("${SPLIT[@]}")

$PY train.py --config "$CONFIG" "${LAYOUT_ARGS[@]}" --eval-temperature 0 "${EXTRA[@]}" --run-dir "$RUN_DIR" "$@"
case " $* " in *" --dry-run "*) exit 0 ;; esac   # a dry run trains nothing to summarise
$PY -m slime_like.demo.summary "$RUN_DIR" val

#!/usr/bin/env bash
# Run every benchmark once; each prints its table and leaves a JSON result in bench/results/.
#
#   bash bench/run_all.sh            # everything (about 30-60 min on a shared 2-core machine)
#   QUICK=1 bash bench/run_all.sh    # fewer steps / repeats (a smoke run, numbers are noisy)
#
# The TRL peer's venv (bench/.venv-trl) is built first if missing. Timings never decide pass/fail; compare the
# ratios inside one script's output (both sides ran in the same invocation, under the same load).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
mkdir -p bench/results
if [ "${QUICK:-0}" = 1 ]; then E2E="--steps-tiny 4 --steps-100m 2"; REP=2; else E2E="--steps-tiny 12 --steps-100m 3"; REP=5; fi
log() { echo; echo "=== $* ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"; }

log "machine"; echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo)" | tee bench/results/machine.txt
[ -x bench/.venv-trl/bin/python ] || bash bench/trl_peer/setup_env.sh
# vLLM as an engine of ours (--rollout-engine vllm) beside the cpu engine, when its venv is built
# (bash bench/vllm_peer/setup_env.sh)
VLLM_ROLLOUT=""; ENGINES=cpu
if [ -x bench/.venv-vllm/bin/python ]; then VLLM_ROLLOUT="--vllm-engine"; ENGINES=cpu,vllm; fi

log "1. end to end vs TRL";       $PY bench/bench_e2e.py $E2E
log "2. rollout throughput";      $PY bench/bench_rollout.py $VLLM_ROLLOUT | tee bench/results/bench_rollout.log
tail -1 bench/results/bench_rollout.log > bench/results/bench_rollout.json   # its last line is the JSON
log "3. train step throughput";   $PY bench/bench_train_step.py --out bench/results/bench_train_step.json
log "4. weight sync";             $PY bench/bench_weight_sync.py --repeat $REP --engines $ENGINES
log "5. start-up";                $PY bench/bench_startup.py --repeat $([ "${QUICK:-0}" = 1 ] && echo 1 || echo 3)
log "6. loop modes (sync / one-step-off / fully async)"; $PY bench/bench_fully_async.py --rollouts $([ "${QUICK:-0}" = 1 ] && echo 10 || echo 40)
log "plot";                       $PY bench/bench_e2e.py --plot-only docs/benchmarks.png
log "done: bench/results/*.json"

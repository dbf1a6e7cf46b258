#!/usr/bin/env bash
# Submit train.py to a running Ray cluster as a Ray job (slime's `ray job submit ... -- python3 train.py`).
#
#   scripts/ray/submit.sh [train.py flags ...]                     # e.g. "${MODEL_ARGS[@]}" "${ROLLOUT_ARGS[@]}"
#   RAY_DASHBOARD_ADDRESS=http://10.0.0.1:8265 scripts/ray/submit.sh --dry-run ...   # head's job API elsewhere
#
# Default address: the job API on this host (run it on the head node; the head binds the API to 127.0.0.1
# unless RAY_DASHBOARD_HOST says otherwise).
#
# The job's entrypoint runs from the repository root, so relative paths in the flags resolve as they do for
# `python train.py` started here; PYTHONPATH carries the repository (the job does not upload a working dir:
# every node must see the same filesystem, as on a Slurm cluster). `ray job submit` waits for the job and
# returns its exit status; SUBMIT_FLAGS adds flags of its own (e.g. SUBMIT_FLAGS=--no-wait).
# Set TRAIN_SCRIPT=train_async.py for the pipelined loop.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/_common.sh"
repo=$(cd "$here/../.." && pwd)
script=${TRAIN_SCRIPT:-train.py}
[[ -f $repo/$script ]] || ray_die "TRAIN_SCRIPT=$script: no such file in $repo"
address=${RAY_DASHBOARD_ADDRESS:-http://127.0.0.1:$RAY_DASHBOARD_PORT}
python=$RAY_PYTHON

# env_vars as JSON without hand-quoting: python builds it from the environment.
runtime_env=$(RUNTIME_PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$RAY_PYTHON" -c '
import json, os
env = {k: os.environ[k] for k in ("RAY_AUTH_MODE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS",
                                  "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k in os.environ}
env["PYTHONPATH"] = os.environ["RUNTIME_PYTHONPATH"]
print(json.dumps({"env_vars": env}))')

echo "ray job submit to $address: $script $*"
# shellcheck disable=SC2086  # SUBMIT_FLAGS is a list of flags
exec ray job submit --address="$address" --runtime-env-json="$runtime_env" ${SUBMIT_FLAGS:-} \
  -- bash -c 'cd "$0" && exec "$1" "${@:2}"' "$repo" "$python" "$script" "$@"

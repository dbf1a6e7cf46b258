#!/usr/bin/env bash
# Block until the Ray cluster has NODES alive nodes and GPUS GPU slots in total; exit 1 naming what is
# missing after TIMEOUT seconds (default 180).
#
#   scripts/ray/wait-for-nodes.sh NODES [GPUS] [TIMEOUT]
#   RAY_ADDRESS=10.0.0.1:6379 scripts/ray/wait-for-nodes.sh 2 16
#
# The address is RAY_ADDRESS, else RAY_HEAD_IP:RAY_PORT (scripts/ray/_common.sh).
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/_common.sh"
[[ $# -ge 1 && $# -le 3 ]] || ray_die "usage: $0 NODES [GPUS] [TIMEOUT_SECONDS]"
ray_check_int NODES "$1"; ray_check_int GPUS "${2:-0}"; ray_check_int TIMEOUT_SECONDS "${3:-180}"
exec "$RAY_PYTHON" "$here/wait_for_nodes.py" --address "${RAY_ADDRESS:-$RAY_HEAD_IP:$RAY_PORT}" \
  --nodes "$1" --gpus "${2:-0}" --timeout "${3:-180}" ${RAY_WAIT_HINT:+--hint "$RAY_WAIT_HINT"}

#!/usr/bin/env bash
# Start the head node of a Ray cluster (slime's flow: `ray start --head` here, `ray start --address` on the
# other nodes, then `ray job submit -- python train.py ...` or `RAY_ADDRESS=... python train.py ...`).
#
#   scripts/ray/start-head.sh [--block] [more `ray start` flags]
#   RAY_NUM_GPUS=4 scripts/ray/start-head.sh          # CPU-only machine: declare 4 GPU slots
#
# Settings come from RAY_* variables (see scripts/ray/_common.sh). The dashboard / job API listens on
# RAY_DASHBOARD_HOST (default 127.0.0.1: submit jobs from the head node; 0.0.0.0 opens it to the network).
# With --block the command stays in the foreground and SIGTERM stops every Ray process it started: that is
# how the Slurm job scripts run it under `srun`, so signalling the job step tears the node down. Without
# --block Ray daemonizes; stop it with `ray stop` (which stops *all* Ray processes of this user on the host).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
ray_node_flags
ray_ensure_token
include_dashboard=${RAY_INCLUDE_DASHBOARD:-true}
[[ $include_dashboard == true || $include_dashboard == false ]] \
  || ray_die "RAY_INCLUDE_DASHBOARD=$include_dashboard must be true or false"

echo "ray head: $RAY_HEAD_IP:$RAY_PORT  dashboard=$include_dashboard:$RAY_DASHBOARD_PORT  temp=$RAY_TEMP_DIR  ${RAY_NODE_FLAGS[*]:0:2}"
# exec: under srun the signal must reach `ray start` itself, which then stops its children.
exec ray start --head --node-ip-address="$RAY_HEAD_IP" --port="$RAY_PORT" \
  --include-dashboard="$include_dashboard" --dashboard-host="${RAY_DASHBOARD_HOST:-127.0.0.1}" --dashboard-port="$RAY_DASHBOARD_PORT" \
  --ray-client-server-port="$RAY_CLIENT_PORT" "${RAY_NODE_FLAGS[@]}" "$@"

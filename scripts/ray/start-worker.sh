#!/usr/bin/env bash
# Join this node to a running Ray cluster as a worker node.
#
#   scripts/ray/start-worker.sh HEAD_IP:PORT [--block] [more `ray start` flags]
#   RAY_NUM_GPUS=4 scripts/ray/start-worker.sh 10.0.0.1:6379
#
# HEAD_IP:PORT may also come from RAY_HEAD_IP / RAY_PORT. Resources and temp dir: RAY_* variables (see
# scripts/ray/_common.sh). Waits up to RAY_WAIT_TIMEOUT (180 s) for the head to listen. With --block,
# SIGTERM stops this node's Ray processes (how the Slurm job scripts run it under `srun`).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
address=$RAY_HEAD_IP:$RAY_PORT
if [[ $# -gt 0 && $1 != -* ]]; then address=$1; shift; fi
[[ $address =~ ^[^:]+:[0-9]+$ ]] || ray_die "head address '$address' is not HOST:PORT (e.g. 10.0.0.1:6379)"
ray_node_flags

# `ray start --address` gives up if the head's GCS is not up yet: wait for its port first (the head may
# still be starting, e.g. when all nodes are launched at once).
wait_s=${RAY_WAIT_TIMEOUT:-180}
ray_check_int RAY_WAIT_TIMEOUT "$wait_s"
t0=$SECONDS
until (exec 3<>"/dev/tcp/${address%:*}/${address##*:}") 2>/dev/null; do
  (( SECONDS - t0 < wait_s )) || { echo "error: the Ray head at $address did not accept connections within $wait_s s (RAY_WAIT_TIMEOUT); is it running, and is the port open from $(hostname)?" >&2; exit 1; }
  sleep 1
done

# The node's own address: the one it reaches the head from (several NICs: the route to the head wins).
node_ip=${RAY_NODE_IP:-$(ip -o route get "${address%:*}" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}')}
node_flags=()
[[ -n $node_ip ]] && node_flags=(--node-ip-address="$node_ip")
echo "ray worker: joining $address from ${node_ip:-auto}  temp=$RAY_TEMP_DIR  ${RAY_NODE_FLAGS[*]:0:2}"
exec ray start --address="$address" "${node_flags[@]}" "${RAY_NODE_FLAGS[@]}" "$@"

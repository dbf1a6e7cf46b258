#!/usr/bin/env bash
# Join this node to a running Ray cluster as a worker node.
#
#   scripts/ray/start-worker.sh HEAD_IP:PORT [--block] [more `ray start` flags]
#   RAY_NUM_GPUS=4 scripts/ray/start-worker.sh 10.0.0.1:6379
#
# HEAD_IP:PORT may also come from RAY_HEAD_IP / RAY_PORT. Resources and temp dir: RAY_* variables (see
# scripts/ray/_common.sh). With --block, SIGTERM stops this node's Ray processes (how the Slurm job
# scripts run it under `srun`).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
address=$RAY_HEAD_IP:$RAY_PORT
if [[ $# -gt 0 && $1 != -* ]]; then address=$1; shift; fi
[[ $address =~ ^[^:]+:[0-9]+$ ]] || ray_die "head address '$address' is not HOST:PORT (e.g. 10.0.0.1:6379)"
ray_node_flags

# The node's own address: the one it reaches the head from (several NICs: the route to the head wins).
node_ip=${RAY_NODE_IP:-$(ip -o route get "${address%:*}" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}')}
node_flags=()
[[ -n $node_ip ]] && node_flags=(--node-ip-address="$node_ip")
echo "ray worker: joining $address from ${node_ip:-auto}  temp=$RAY_TEMP_DIR  ${RAY_NODE_FLAGS[*]:0:2}"
exec ray start --address="$address" "${node_flags[@]}" "${RAY_NODE_FLAGS[@]}" "$@"

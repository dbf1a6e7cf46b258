# shellcheck shell=bash
# Shared by start-head.sh / start-worker.sh / wait-for-nodes.sh / submit.sh (sourced, not run).
# Reads the RAY_* variables below, checks them, and fills defaults. Every variable is optional:
#
#   RAY_HEAD_IP        address the head advertises; default: this host's first address (`hostname --ip-address`)
#   RAY_PORT           GCS port of the head (6379)          RAY_DASHBOARD_PORT   dashboard / job API (8265)
#   RAY_CLIENT_PORT    Ray client server (10001)            RAY_AGENT_PORT       dashboard agent http (52365)
#   RAY_MIN_WORKER_PORT / RAY_MAX_WORKER_PORT  ports worker processes bind (Ray's default 10002-19999)
#   RAY_NUM_GPUS       GPU slots this node declares. Default: SLURM_GPUS_ON_NODE, else the entries of
#                      CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`, else 0. On a CPU-only node set it to declare
#                      GPU slots as Ray resources, so placement is exercised exactly as on GPUs.
#   RAY_NUM_CPUS       CPUs this node declares (default: SLURM_CPUS_ON_NODE, else nproc)
#   RAY_TEMP_DIR       Ray's temp/session root (default /tmp/ray). Keep it short: Ray puts unix sockets under
#                      it and a socket path must stay below 108 bytes.
#   RAY_INCLUDE_DASHBOARD  true|false (default true: `ray job submit` needs it)
#   RAY_AUTH_MODE      token (default): Ray's token authentication on GCS, raylets, dashboard and job API.
#   RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH   the cluster's secret. Unset: ~/.ray/auth_token, which start-head.sh
#                      creates (mode 600) when missing; every node and the driver need the same token (a shared
#                      $HOME does it; else copy the file or export RAY_AUTH_TOKEN). See docs/multinode.md.

ray_die() { echo "error: $*" >&2; exit 2; }

# ray_check_int NAME VALUE: VALUE must be a non-negative integer (names the variable and the fix otherwise).
ray_check_int() {
  [[ $2 =~ ^[0-9]+$ ]] || ray_die "$1=$2 is not a non-negative integer; set $1 to a number (e.g. $1=4) or unset it"
}

ray_check_port() {
  ray_check_int "$1" "$2"
  (( $2 >= 1 && $2 <= 65535 )) || ray_die "$1=$2 is not a TCP port (1-65535)"
}

# Pick up the venv's ray if the caller did not activate one (job steps start with a plain PATH).
if ! command -v ray >/dev/null 2>&1; then
  _ray_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  [[ -x $_ray_repo/.venv/bin/ray ]] && export PATH="$_ray_repo/.venv/bin:$PATH"
  command -v ray >/dev/null 2>&1 || ray_die "no 'ray' command on PATH; activate the venv (. .venv/bin/activate) or run scripts/setup.sh"
fi
# The interpreter that has this `ray` installed (for the small Python helpers next to these scripts).
RAY_PYTHON=$(dirname "$(command -v ray)")/python
[[ -x $RAY_PYTHON ]] || RAY_PYTHON=python

if [[ ${RAY_AUTH_MODE:-token} != token ]]; then
  echo "note: RAY_AUTH_MODE=$RAY_AUTH_MODE ignored: these scripts start network-facing Ray nodes, always with token authentication" >&2
fi
export RAY_AUTH_MODE=token
export RAY_USAGE_STATS_ENABLED=${RAY_USAGE_STATS_ENABLED:-0}

RAY_PORT=${RAY_PORT:-6379}
RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
RAY_CLIENT_PORT=${RAY_CLIENT_PORT:-10001}
RAY_AGENT_PORT=${RAY_AGENT_PORT:-52365}
for _v in RAY_PORT RAY_DASHBOARD_PORT RAY_CLIENT_PORT RAY_AGENT_PORT; do ray_check_port "$_v" "${!_v}"; done
RAY_TEMP_DIR=${RAY_TEMP_DIR:-/tmp/ray}
[[ $RAY_TEMP_DIR == /* ]] || ray_die "RAY_TEMP_DIR=$RAY_TEMP_DIR must be an absolute path"
# Ray's deepest socket: <temp>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store (~64 bytes past <temp>).
(( ${#RAY_TEMP_DIR} <= 40 )) || ray_die "RAY_TEMP_DIR=$RAY_TEMP_DIR is ${#RAY_TEMP_DIR} characters; Ray's unix socket paths under it would pass the 107-byte limit. Use a short path such as /tmp/ray_\$SLURM_JOB_ID"

if [[ -z ${RAY_HEAD_IP:-} ]]; then
  RAY_HEAD_IP=$(hostname --ip-address 2>/dev/null | awk '{print $1}')
  [[ -n $RAY_HEAD_IP ]] || RAY_HEAD_IP=127.0.0.1
fi

# GPU slots of this node (see the header).
ray_num_gpus() {
  if [[ -n ${RAY_NUM_GPUS:-} ]]; then ray_check_int RAY_NUM_GPUS "$RAY_NUM_GPUS"; echo "$RAY_NUM_GPUS"
  elif [[ -n ${SLURM_GPUS_ON_NODE:-} ]]; then echo "$SLURM_GPUS_ON_NODE"
  elif [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .
  elif command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
  else echo 0
  fi
}

ray_num_cpus() {
  local n=${RAY_NUM_CPUS:-${SLURM_CPUS_ON_NODE:-$(nproc)}}
  ray_check_int RAY_NUM_CPUS "$n"; echo "$n"
}

# With token authentication and no token given: create Ray's default token file (what `ray get-auth-token
# --generate` does), readable by this user only, and say where it is.
ray_ensure_token() {
  [[ $RAY_AUTH_MODE == token && -z ${RAY_AUTH_TOKEN:-} && -z ${RAY_AUTH_TOKEN_PATH:-} ]] || return 0
  local file=$HOME/.ray/auth_token
  if [[ ! -s $file ]]; then
    (umask 077 && mkdir -p "$HOME/.ray" && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$file")
    echo "ray auth: generated a token in $file; worker nodes and drivers need the same file (or RAY_AUTH_TOKEN)" >&2
  fi
}

# Flags shared by head and worker nodes: resources, temp dir, ports.
ray_node_flags() {
  local gpus; gpus=$(ray_num_gpus)
  RAY_NODE_FLAGS=(--num-cpus="$(ray_num_cpus)" --num-gpus="$gpus" --temp-dir="$RAY_TEMP_DIR"
                  --dashboard-agent-listen-port="$RAY_AGENT_PORT" --disable-usage-stats)
  if [[ -n ${RAY_MIN_WORKER_PORT:-}${RAY_MAX_WORKER_PORT:-} ]]; then
    ray_check_port RAY_MIN_WORKER_PORT "${RAY_MIN_WORKER_PORT:-}"; ray_check_port RAY_MAX_WORKER_PORT "${RAY_MAX_WORKER_PORT:-}"
    (( RAY_MIN_WORKER_PORT < RAY_MAX_WORKER_PORT )) || ray_die "RAY_MIN_WORKER_PORT=$RAY_MIN_WORKER_PORT must be below RAY_MAX_WORKER_PORT=$RAY_MAX_WORKER_PORT"
    RAY_NODE_FLAGS+=(--min-worker-port="$RAY_MIN_WORKER_PORT" --max-worker-port="$RAY_MAX_WORKER_PORT")
  fi
  if (( gpus == 0 )); then
    echo "note: no GPUs found on $(hostname); this node declares 0 GPU slots (set RAY_NUM_GPUS=N to declare N)" >&2
  fi
}

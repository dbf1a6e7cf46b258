# shellcheck shell=bash
# Ray cluster inside a Slurm allocation. Sourced by the *.sbatch job scripts:
#
#   source "$SLIME_LIKE_ROOT/scripts/slurm/ray_cluster.sh"
#   ray_cluster_up                     # head on the first node, workers on the rest, wait for all GPU slots
#   ray_cluster_run python train.py …  # the driver, on the first node; its exit status is returned
#   (teardown is automatic: an EXIT/TERM/INT trap stops every Ray process the job started)
#
# Everything per-job is derived from Slurm's environment:
#   head node     first host of SLURM_JOB_NODELIST; its address is the node's NodeAddr (`scontrol show node`),
#                 resolved to IPv4, unless RAY_HEAD_IP is set (e.g. the InfiniBand address).
#   ports         a block of 1000 ports picked by SLURM_JOB_ID, so two jobs that share a node do not collide:
#                 base = 20000 + (SLURM_JOB_ID % 12) * 1000   (stays below Linux's ephemeral range, 32768+,
#                 and above Ray's default worker ports). GCS base, dashboard base+1, client base+2, dashboard
#                 agent base+10+i and worker ports base+100+225*i .. +224 for node i (mod 4: distinct nodes are
#                 distinct hosts on a real cluster; the offsets matter when Slurm nodes share a host, as in
#                 scripts/slurm/local_cluster.sh). Any RAY_* variable set before sourcing wins.
#   temp dir      /tmp/ray_$SLURM_JOB_ID on every node (short: Ray's socket paths must stay < 108 bytes),
#                 removed at the end (job ids restart after a Slurm controller reset).
#   GPU slots     SLURM_GPUS_ON_NODE (from --gres=gpu:N / --gpus-per-node), else RAY_NUM_GPUS; declared with
#                 --num-gpus, so a CPU-only node still offers GPU slots to the placement code.
#   logs          $RAY_LOG_DIR (default $SLURM_SUBMIT_DIR/logs)/ray-<jobid>-{head,workers}.log
#
# RAY_SRUN_FLAGS: extra srun flags for the Ray node steps (containers, GPU binding), split on spaces.
# Timeouts: RAY_WAIT_TIMEOUT (default 180 s) for all nodes and GPU slots to join; DRIVER_STOP_TIMEOUT (30 s)
# between SIGTERM and SIGKILL for a driver still running at teardown.

_rc_die() { echo "error: $*" >&2; exit 2; }
# DRY_RUN=1 outside a job (`DRY_RUN=1 bash scripts/slurm/ppo.sbatch`): no allocation needed. The job script
# plans for NODES x GPUS_PER_NODE (default 2 x 8, the #SBATCH lines) and stops after `train.py --dry-run`.
if [[ ${DRY_RUN:-0} == 1 && -z ${SLURM_JOB_ID:-} ]]; then
  SLIME_LIKE_ROOT=${SLIME_LIKE_ROOT:-$PWD}
  SLURM_SUBMIT_DIR=${SLURM_SUBMIT_DIR:-$PWD} SLURM_JOB_ID=dry-run
  RAY_NUM_NODES=${NODES:-2} RAY_GPUS_PER_NODE=${GPUS_PER_NODE:-8}
  if [[ -z ${VIRTUAL_ENV:-} && -f $SLIME_LIKE_ROOT/.venv/bin/activate ]]; then
    # shellcheck disable=SC1091
    source "$SLIME_LIKE_ROOT/.venv/bin/activate"
  fi
  ray_cluster_up() { _rc_die "DRY_RUN=1: no Ray cluster outside a Slurm job"; }
  return 0
fi
[[ -n ${SLURM_JOB_ID:-} && -n ${SLURM_JOB_NODELIST:-} ]] \
  || _rc_die "ray_cluster.sh runs inside a Slurm job (SLURM_JOB_ID / SLURM_JOB_NODELIST are not set); submit with sbatch"
command -v srun >/dev/null || _rc_die "srun is not on PATH inside the job"

SLIME_LIKE_ROOT=${SLIME_LIKE_ROOT:-$SLURM_SUBMIT_DIR}
[[ -f $SLIME_LIKE_ROOT/train.py && -d $SLIME_LIKE_ROOT/scripts/ray ]] \
  || _rc_die "SLIME_LIKE_ROOT=$SLIME_LIKE_ROOT is not the slime_like repository (no train.py / scripts/ray); submit from the repository root or pass --export=ALL,SLIME_LIKE_ROOT=/path/to/repo"
if [[ -z ${VIRTUAL_ENV:-} && -f $SLIME_LIKE_ROOT/.venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  source "$SLIME_LIKE_ROOT/.venv/bin/activate"
fi

mapfile -t RAY_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
RAY_HEAD_NODE=${RAY_NODES[0]}
RAY_NUM_NODES=${#RAY_NODES[@]}

export RAY_PORT_BASE=${RAY_PORT_BASE:-$(( 20000 + (SLURM_JOB_ID % 12) * 1000 ))}
export RAY_PORT=${RAY_PORT:-$RAY_PORT_BASE}
export RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-$((RAY_PORT_BASE + 1))}
export RAY_CLIENT_PORT=${RAY_CLIENT_PORT:-$((RAY_PORT_BASE + 2))}
export RAY_TEMP_DIR=${RAY_TEMP_DIR:-/tmp/ray_$SLURM_JOB_ID}
export RAY_INCLUDE_DASHBOARD=${RAY_INCLUDE_DASHBOARD:-false}  # the driver runs in the job; no job API needed
# Ray token authentication, with a secret of this job: generated here on the batch host, handed to every step
# (srun exports the environment) and to the driver, never written to disk. RAY_AUTH_TOKEN / _PATH set by the
# user win (e.g. to attach a job to a cluster with a known token); RAY_AUTH_MODE=disabled is never used.
if [[ ${RAY_AUTH_MODE:-token} != token ]]; then
  echo "note: RAY_AUTH_MODE=$RAY_AUTH_MODE ignored: the job's Ray cluster listens on the network, so it always runs with token authentication" >&2
fi
export RAY_AUTH_MODE=token
if [[ -z ${RAY_AUTH_TOKEN:-} && -z ${RAY_AUTH_TOKEN_PATH:-} ]]; then
  RAY_AUTH_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  export RAY_AUTH_TOKEN
fi
export RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=${RAY_DEDUP_LOGS:-0}
# On SIGTERM Ray 2.60 first "drains" the node for 30 s (for Ray Serve); a finished job has nothing to drain.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}
RAY_LOG_DIR=${RAY_LOG_DIR:-$SLURM_SUBMIT_DIR/logs}

if [[ -z ${RAY_HEAD_IP:-} ]]; then
  _rc_addr=$(scontrol show node "$RAY_HEAD_NODE" -o | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
  RAY_HEAD_IP=$(getent ahostsv4 "${_rc_addr:-$RAY_HEAD_NODE}" | awk 'NR == 1 {print $1}')
  [[ -n $RAY_HEAD_IP ]] || _rc_die "cannot resolve the head node $RAY_HEAD_NODE (NodeAddr=${_rc_addr:-?}) to an IPv4 address; set RAY_HEAD_IP"
fi
export RAY_HEAD_IP
export RAY_ADDRESS=$RAY_HEAD_IP:$RAY_PORT
# For code that reads it (torch.distributed's env:// rendezvous); the trainer group picks its own master.
export MASTER_ADDR=${MASTER_ADDR:-$RAY_HEAD_IP}

RAY_GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-${RAY_NUM_GPUS:-}}
[[ -n $RAY_GPUS_PER_NODE ]] || _rc_die "no GPU count for the Ray nodes: request GPUs (#SBATCH --gres=gpu:N) or set RAY_NUM_GPUS=N (CPU-only nodes declare N GPU slots)"
[[ $RAY_GPUS_PER_NODE =~ ^[0-9]+$ ]] || _rc_die "GPUs per node '$RAY_GPUS_PER_NODE' (SLURM_GPUS_ON_NODE / RAY_NUM_GPUS) is not an integer"
export RAY_NUM_GPUS=$RAY_GPUS_PER_NODE

_RC_STEP_PIDS=()
declare -gA _RC_STEP_PIDS_BY_NAME=()
_RC_DRIVER_PID=

# Stop everything this job started, in order: the driver, then the node steps (SIGTERM: `ray start --block`
# stops its children), then the temp dirs. Idempotent; runs from the EXIT trap, also after scancel.
ray_cluster_down() {
  local rc=$?
  set +e  # best effort from here on: one failed kill must not skip the rest
  trap - EXIT TERM INT
  if [[ -n $_RC_DRIVER_PID ]] && kill -0 "$_RC_DRIVER_PID" 2>/dev/null; then
    kill -TERM "$_RC_DRIVER_PID" 2>/dev/null  # train.py turns it into a clean shutdown of its actors
    for _ in $(seq 1 "${DRIVER_STOP_TIMEOUT:-30}"); do kill -0 "$_RC_DRIVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$_RC_DRIVER_PID" 2>/dev/null
  fi
  # SIGTERM to the tasks of the Ray steps, workers first, then the head (not to srun: srun answers SIGTERM by
  # killing its step with SIGKILL, which gives `ray start --block` no chance to stop its processes in order).
  local name step pid
  for name in ray-workers ray-head; do
    step=$(squeue -h -s -j "$SLURM_JOB_ID" -o "%i %j" 2>/dev/null | awk -v n="$name" '$2 == n {print $1}')
    pid=${_RC_STEP_PIDS_BY_NAME[$name]:-}
    [[ -n $step ]] && scancel --signal=TERM "$step" 2>/dev/null
    [[ -n $pid ]] || continue
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then  # then srun's own way: the step and all its processes are killed
      echo "ray_cluster_down: $name step (srun pid $pid) still running 20 s after SIGTERM; cancelling it" >&2
      kill -TERM "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
  done
  if (( ${#_RC_STEP_PIDS[@]} )); then
    srun --overlap --nodes="$RAY_NUM_NODES" --ntasks="$RAY_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=0 \
         rm -rf "$RAY_TEMP_DIR" >/dev/null 2>&1 || rm -rf "$RAY_TEMP_DIR"
    echo "$(date +%T) ray cluster of job $SLURM_JOB_ID stopped (exit status $rc)"
  fi
  _RC_STEP_PIDS=()
  exit "$rc"
}

# bash runs a trap only between commands: the driver runs in the background and is `wait`ed for, so a
# SIGTERM from scancel / the time limit interrupts the wait at once.
trap ray_cluster_down EXIT
trap 'echo "job $SLURM_JOB_ID: signal received, stopping"; exit 143' TERM INT

# Workers give up if the head's GCS does not answer soon enough: start them once its port accepts connections.
_rc_wait_for_head() {
  local t0=$SECONDS timeout=${RAY_WAIT_TIMEOUT:-180}
  until (exec 3<>"/dev/tcp/$RAY_HEAD_IP/$RAY_PORT") 2>/dev/null; do
    if ! kill -0 "${_RC_STEP_PIDS[0]}" 2>/dev/null; then
      echo "error: the Ray head step on $RAY_HEAD_NODE exited before its GCS listened on $RAY_ADDRESS; its log ($1):" >&2
      tail -n 30 "$1" >&2; exit 1
    fi
    if (( SECONDS - t0 > timeout )); then
      echo "error: the Ray head on $RAY_HEAD_NODE did not listen on $RAY_ADDRESS within $timeout s (RAY_WAIT_TIMEOUT); its log ($1):" >&2
      tail -n 30 "$1" >&2; exit 1
    fi
    sleep 1
  done
}

ray_cluster_up() {
  local here=$SLIME_LIKE_ROOT/scripts/ray log_head=$RAY_LOG_DIR/ray-$SLURM_JOB_ID-head.log
  local log_workers=$RAY_LOG_DIR/ray-$SLURM_JOB_ID-workers.log total_gpus=$(( RAY_NUM_NODES * RAY_GPUS_PER_NODE ))
  local _rc_srun_flags=()
  # Site-specific flags for the Ray node steps, e.g. --container-image=... (pyxis) or --gres=gpu:8.
  read -r -a _rc_srun_flags <<<"${RAY_SRUN_FLAGS:-}"
  mkdir -p "$RAY_LOG_DIR"
  echo "$(date +%T) job $SLURM_JOB_ID: Ray head on $RAY_HEAD_NODE ($RAY_ADDRESS), $RAY_NUM_NODES node(s) x $RAY_GPUS_PER_NODE GPU slot(s), temp $RAY_TEMP_DIR"
  # Stale sessions of an earlier job with the same id (ids restart at 1 after a controller reset).
  srun --overlap --nodes="$RAY_NUM_NODES" --ntasks="$RAY_NUM_NODES" --ntasks-per-node=1 rm -rf "$RAY_TEMP_DIR"

  RAY_AGENT_PORT=${RAY_AGENT_PORT:-$((RAY_PORT_BASE + 10))} \
  RAY_MIN_WORKER_PORT=${RAY_MIN_WORKER_PORT:-$((RAY_PORT_BASE + 100))} \
  RAY_MAX_WORKER_PORT=${RAY_MAX_WORKER_PORT:-$((RAY_PORT_BASE + 324))} \
    srun --overlap --nodes=1 --ntasks=1 -w "$RAY_HEAD_NODE" --job-name=ray-head --output="$log_head" \
         "${_rc_srun_flags[@]}" bash "$here/start-head.sh" --block &
  _RC_STEP_PIDS+=($!); _RC_STEP_PIDS_BY_NAME[ray-head]=$!
  _rc_wait_for_head "$log_head"
  if (( RAY_NUM_NODES > 1 )); then
    # One step for all workers; each task derives its ports from its node index in the step.
    srun --overlap --nodes=$((RAY_NUM_NODES - 1)) --ntasks=$((RAY_NUM_NODES - 1)) --ntasks-per-node=1 \
         --exclude="$RAY_HEAD_NODE" --job-name=ray-workers --output="$log_workers" --kill-on-bad-exit=0 \
         "${_rc_srun_flags[@]}" bash -c 'i=$(( (SLURM_NODEID + 1) % 4 ));
                  export RAY_AGENT_PORT=${RAY_AGENT_PORT:-$(( RAY_PORT_BASE + 10 + i ))}
                  export RAY_MIN_WORKER_PORT=${RAY_MIN_WORKER_PORT:-$(( RAY_PORT_BASE + 100 + 225 * i ))}
                  export RAY_MAX_WORKER_PORT=${RAY_MAX_WORKER_PORT:-$(( RAY_PORT_BASE + 324 + 225 * i ))}
                  exec bash "$0" "$RAY_HEAD_IP:$RAY_PORT" --block' "$here/start-worker.sh" &
    _RC_STEP_PIDS+=($!); _RC_STEP_PIDS_BY_NAME[ray-workers]=$!
  fi
  # wait_for_nodes retries the connection while the head starts; workers retry joining on their own.
  python "$here/wait_for_nodes.py" --address "$RAY_ADDRESS" --nodes "$RAY_NUM_NODES" --gpus "$total_gpus" \
    --timeout "${RAY_WAIT_TIMEOUT:-180}" --hint "Node logs: $log_head, $log_workers (Ray's own: $RAY_TEMP_DIR/session_latest/logs on each node)." \
    || { echo "--- tail of $log_head"; tail -n 20 "$log_head" 2>/dev/null
         echo "--- tail of $log_workers"; tail -n 20 "$log_workers" 2>/dev/null; exit 1; } >&2
}

# Run the driver in the background and wait for it (see the trap note above); returns its exit status.
ray_cluster_run() {
  "$@" &
  _RC_DRIVER_PID=$!
  local rc=0
  wait "$_RC_DRIVER_PID" || rc=$?
  _RC_DRIVER_PID=
  return "$rc"
}

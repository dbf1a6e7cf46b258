#!/usr/bin/env bash
# A real Slurm 22.05 "cluster" on this one host, for trying and testing the job scripts. No systemd: the
# daemons (munged, slurmctld, one slurmd per node) are started directly, everything lives under $BASE.
#
#   scripts/slurm/local_cluster.sh start     install (Debian/Ubuntu packages, needs root) and start; prints
#                                            the `export SLURM_CONF=...` line to use sbatch / srun / squeue
#   scripts/slurm/local_cluster.sh stop      cancel this cluster's jobs, stop the daemons it started (pid files)
#   scripts/slurm/local_cluster.sh status    sinfo + squeue of this cluster
#
# Settings (environment):
#   NODES=2            Slurm nodes n1..nN; each is its own slurmd on this host (own port, spool, name)
#   GPUS_PER_NODE=4    fake GPUs per node (character devices like /dev/null, so `--gres=gpu:N` works and jobs
#                      see CUDA_VISIBLE_DEVICES; there is no GPU behind them)
#   BASE=/tmp/slurm-local   config, state, logs, munge key and socket, fake devices
#   SLURMCTLD_PORT=6817, SLURMD_PORT=17001 (node i uses SLURMD_PORT+i-1)
# Exit status: 0 ok, 2 bad setting, 3 packages missing and apt-get unavailable, 1 anything else.
set -euo pipefail
CMD=${1:-start}
BASE=${BASE:-/tmp/slurm-local}
NODES=${NODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
SLURMCTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-17001}
CONF=$BASE/etc/slurm.conf
RUN=$BASE/run
export SLURM_CONF=$CONF

die() { echo "local_cluster: error: $*" >&2; exit "${2:-1}"; }
for v in NODES GPUS_PER_NODE SLURMCTLD_PORT SLURMD_PORT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v=${!v} is not a non-negative integer" 2
done
(( NODES >= 1 && NODES <= 16 )) || die "NODES=$NODES: use 1 to 16 nodes" 2
[[ $BASE == /* ]] || die "BASE=$BASE must be an absolute path" 2

stop_daemons() {
  shopt -s nullglob
  local f pid
  for f in "$RUN"/slurmd-*.pid "$RUN"/slurmctld.pid "$RUN"/munged.pid; do
    pid=$(cat "$f" 2>/dev/null || true)
    if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" && echo "stopped $(basename "$f" .pid) (pid $pid)"
      # Wait: a dying slurmctld unlinks its pid file, which would delete the file of a new daemon.
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$f"
  done
}

cancel_jobs() {  # jobs still running would leave slurmstepd processes behind the daemons
  [[ -f $CONF && -f $RUN/slurmctld.pid ]] || return 0
  local ids
  ids=$(squeue -h -o %i 2>/dev/null || true)
  [[ -z $ids ]] && return 0
  echo "cancelling jobs: ${ids//$'\n'/ }"
  # shellcheck disable=SC2086
  scancel $ids 2>/dev/null || true
  for _ in $(seq 1 60); do
    [[ -z $(squeue -h -t running,completing,pending -o %i 2>/dev/null) ]] && return 0
    sleep 1
  done
  echo "warning: jobs still listed after 60 s: $(squeue -h -o '%i %T' | tr '\n' ' ')" >&2
}

case $CMD in
  stop) cancel_jobs; stop_daemons; exit 0 ;;
  status) sinfo; squeue -t all; exit 0 ;;
  start) ;;
  *) die "unknown command '$CMD'; use start, stop or status" 2 ;;
esac

# 1. packages: Debian 12 ships Slurm 22.05 and munge 0.5. Root is needed for apt-get and for slurmd.
(( EUID == 0 )) || die "run as root: apt-get, mknod and slurmd (which launches jobs as their users) need it"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  command -v apt-get >/dev/null || die "Slurm is not installed and apt-get is not available to install slurmctld slurmd slurm-client munge" 3
  echo "installing slurmctld slurmd slurm-client munge (apt-get)"
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                slurmctld slurmd slurm-client munge >"$BASE.apt.log" 2>&1; }
  mkdir -p "$(dirname "$BASE")"
  apt_install || { apt-get update -q >"$BASE.apt.log" 2>&1 && apt_install; } \
    || { tail -n 20 "$BASE.apt.log" >&2; die "apt-get could not install the Slurm packages (log: $BASE.apt.log)"; }
fi

cancel_jobs; stop_daemons  # whatever an earlier start left running

# 2. directories and munge key (munged insists on a 0600 key and directories others cannot write)
mkdir -p "$BASE"/{etc,run,state,log,munge,dev,spool}
chmod 700 "$BASE/munge" "$RUN"
KEY=$BASE/munge/munge.key
[[ -s $KEY ]] || mungekey --create --keyfile="$KEY"
chmod 600 "$KEY"

# Fake GPUs: slurmd drops GPUs without a device file ("Removing file-less GPU") and wants character
# devices, so make /dev/null look-alikes (major 1, minor 3).
TOTAL_GPUS=$(( NODES * GPUS_PER_NODE ))
for ((i = 0; i < TOTAL_GPUS; i++)); do
  [[ -c $BASE/dev/nvidia$i ]] || { rm -f "$BASE/dev/nvidia$i"; mknod "$BASE/dev/nvidia$i" c 1 3; }
done

# Split the host between the nodes; Slurm rejects a node that claims more CPUs / memory than it has.
CPUS=$(( $(nproc) / NODES )); (( CPUS >= 1 )) || CPUS=1
MEM_MB=$(awk -v n="$NODES" '/MemTotal/ {print int($2 / 1024 * 0.85 / n)}' /proc/meminfo)
: > "$BASE/etc/gres.conf"
gres= ; (( GPUS_PER_NODE > 0 )) && gres="Gres=gpu:$GPUS_PER_NODE"
for ((n = 1; n <= NODES; n++)); do
  mkdir -p "$BASE/spool/n$n"
  if (( GPUS_PER_NODE > 0 )); then
    lo=$(( (n - 1) * GPUS_PER_NODE )); hi=$(( n * GPUS_PER_NODE - 1 ))
    echo "NodeName=n$n Name=gpu File=$BASE/dev/nvidia[$lo-$hi]" >> "$BASE/etc/gres.conf"
  fi
done

cat > "$CONF" <<EOF
# Written by scripts/slurm/local_cluster.sh: $NODES node(s) on this host, $GPUS_PER_NODE fake GPU(s) each.
ClusterName=slimelocal
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$RUN/munge.socket
SlurmctldPort=$SLURMCTLD_PORT
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
# No cgroups without systemd: track job processes by parent pid, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=60
KillWait=15
# Finished jobs stay visible to scontrol / squeue -t all for 10 minutes.
MinJobAge=600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.txt
GresTypes=gpu
NodeName=n[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$SLURMD_PORT-$(( SLURMD_PORT + NODES - 1 )) CPUs=$CPUS RealMemory=$MEM_MB $gres State=UNKNOWN
PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF

# 3. daemons, started directly; each daemonizes and writes its pid file
munged --socket="$RUN/munge.socket" --key-file="$KEY" --pid-file="$RUN/munged.pid" \
       --log-file="$BASE/log/munged.log" --seed-file="$BASE/munge/munged.seed" --force
munge -S "$RUN/munge.socket" -n | unmunge -S "$RUN/munge.socket" >/dev/null \
  || die "munge round trip failed; see $BASE/log/munged.log"
slurmctld -f "$CONF" -c   # -c: clean state (no stale drain reasons, no old jobs)
for ((n = 1; n <= NODES; n++)); do slurmd -f "$CONF" -N "n$n"; done

# 4. wait until every node is schedulable
states=
for _ in $(seq 1 60); do
  states=$(sinfo -h -o %T 2>/dev/null | sort -u | tr '\n' ' ')
  [[ $states == "idle " ]] && break
  sleep 1
done
if [[ $states != "idle " ]]; then
  scontrol show nodes 2>&1 | grep -E "NodeName|State|Reason" >&2 || true
  tail -n 20 "$BASE/log/slurmctld.log" >&2 || true
  stop_daemons
  die "nodes are not idle after 60 s (states: ${states:-none}); logs in $BASE/log"
fi
sinfo
echo "export SLURM_CONF=$CONF"

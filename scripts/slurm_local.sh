#!/usr/bin/env bash
# A one-node Slurm on this machine, for the tests of `--launcher slurm` (and for trying it by hand):
#
#   scripts/slurm_local.sh start    # installs slurm-wlm and munge if missing (root only), starts the cluster
#   export SLURM_CONF=/tmp/aspan-slurm/slurm.conf   # what `start` prints; then sbatch, squeue, sinfo use it
#   scripts/slurm_local.sh stop
#
# One node (this host, 127.0.0.1) with 2 CPUs in partition `debug`; no cgroups (proctrack/linuxproc, task/none),
# select/cons_tres by core, no accounting. Everything it writes (configuration, state, logs, pid files) lies in
# SLURM_LOCAL_DIR (default /tmp/aspan-slurm); /etc/slurm is not touched. `start` exits non-zero with one line saying
# why when the cluster cannot be started (not root and Slurm missing, apt-get failing, the node not idle in time).
set -euo pipefail
DIR=$(realpath -m "${SLURM_LOCAL_DIR:-/tmp/aspan-slurm}")  # absolute: slurm.conf names files in it
CPUS=${SLURM_LOCAL_CPUS:-2}
CONF=$DIR/slurm.conf

die() { echo "slurm_local: $*" >&2; exit 1; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
     && command -v sbatch >/dev/null; then
    return
  fi
  [ "$(id -u)" -eq 0 ] || die "Slurm (slurm-wlm, munge) is not installed and installing it needs root"
  command -v apt-get >/dev/null || die "Slurm is not installed and there is no apt-get to install it"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null) \
    || die "apt-get install slurm-wlm munge failed"
}

write_conf() {
  local host mem
  host=$(hostname -s)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)  # half the memory, in MB
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  cat > "$CONF" <<EOF
ClusterName=aspan-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${SLURM_LOCAL_PORT:-6917}
SlurmdPort=$(( ${SLURM_LOCAL_PORT:-6917} + 1 ))
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
SchedulerParameters=sched_interval=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start_munge() {
  # The cluster's own munged: its key, socket, pid, log and seed files in $DIR/munge, so `stop` stops exactly the
  # munged `start` started, and a system munged (or another cluster's) is never used, shared or stopped.
  local m=$DIR/munge
  if [ -f "$m/munged.pid" ] && kill -0 "$(cat "$m/munged.pid")" 2>/dev/null; then return; fi
  mkdir -p "$m"; chmod 700 "$m"
  if [ ! -s "$m/munge.key" ]; then
    (umask 077; dd if=/dev/urandom bs=1024 count=1 of="$m/munge.key" 2>/dev/null) || die "could not write $m/munge.key"
  fi
  /usr/sbin/munged --force --socket="$m/munge.socket" --key-file="$m/munge.key" --pid-file="$m/munged.pid" \
    --log-file="$m/munged.log" --seed-file="$m/munged.seed" || die "munged did not start; see $m/munged.log"
}

wait_idle() {
  local i
  for i in $(seq 1 60); do
    if SLURM_CONF=$CONF sinfo -h -o "%t" 2>/dev/null | grep -qx "idle"; then return; fi
    sleep 1
  done
  die "the node is not idle after 60 s (sinfo: $(SLURM_CONF=$CONF sinfo -h -o '%t %E' 2>&1 | head -1)); see $DIR/log"
}

start() {
  install
  [ "$(id -u)" -eq 0 ] || die "starting slurmd needs root (it runs jobs as their users)"
  if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    wait_idle; echo "export SLURM_CONF=$CONF"; return
  fi
  write_conf
  start_munge
  SLURM_CONF=$CONF /usr/sbin/slurmctld -c -f "$CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
  SLURM_CONF=$CONF /usr/sbin/slurmd -f "$CONF" || die "slurmd did not start; see $DIR/log/slurmd.log"
  wait_idle
  echo "export SLURM_CONF=$CONF"
}

stop_pid() {  # stop_pid FILE: end the process FILE names (waiting up to 10 s for it), then remove FILE
  local pid
  [ -f "$1" ] || return 0
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  rm -f "$1"
}

stop() {
  if [ -f "$CONF" ]; then SLURM_CONF=$CONF scancel --quiet --user "$(id -un)" 2>/dev/null || true; fi
  stop_pid "$DIR/slurmd.pid"
  stop_pid "$DIR/slurmctld.pid"
  stop_pid "$DIR/munge/munged.pid"  # last: the Slurm daemons authenticate through it until they stop
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

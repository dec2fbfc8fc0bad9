#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tests and trying srun: munged,
# slurmctld and slurmd (Debian's slurm-wlm and munge, which tools/setup.sh installs), run as
# root, with their configuration, sockets, state and logs in one folder.
#   tools/slurm/one_node.sh start   # starts the daemons; prints `export SLURM_CONF=...`
#   tools/slurm/one_node.sh stop    # stops them (each by its pid file)
#   tools/slurm/one_node.sh status  # sinfo
#   RANNC_SLURM_DIR   the folder (default /tmp/rannc-slurm)
#   RANNC_SLURM_PORT  slurmctld's port; slurmd takes the next (default 6817)
# The node declares the CPUs it has; srun --overcommit puts more tasks on
# them (4 ranks on a 2-core machine). No cgroups (proctrack/linuxproc,
# task/none): a container has no systemd to delegate them.
set -euo pipefail
dir="${RANNC_SLURM_DIR:-/tmp/rannc-slurm}"
port="${RANNC_SLURM_PORT:-6817}"
conf="$dir/slurm.conf"
node="$(hostname -s)"

die() { echo "one_node.sh: error: $*" >&2; exit 1; }

stop_pid() { # stop_pid FILE: the daemon whose pid FILE holds, if it runs
  local f="$1" pid
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

stop() {
  stop_pid "$dir/slurmd.pid"
  stop_pid "$dir/slurmctld.pid"
  stop_pid "$dir/munged.pid"
  echo "one_node.sh: stopped the daemons of $dir" >&2
}

write_conf() {
  local cpus
  cpus="$(nproc)"
  cat >"$conf" <<CONF
# Written by tools/slurm/one_node.sh: a one-node cluster for tests.
ClusterName=rannc
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}

start() {
  for b in munged slurmctld slurmd sinfo srun; do
    command -v "$b" >/dev/null || die "$b is missing: run tools/setup.sh (Debian's slurm-wlm and munge)"
  done
  [ "$(id -u)" -eq 0 ] || die "the daemons run as root here (SlurmUser=root); run as root"
  stop >/dev/null 2>&1 || true
  mkdir -p "$dir/state" "$dir/spool"
  chmod 700 "$dir"
  write_conf
  # munge: a key of this cluster's own, its socket in $dir.
  if [ ! -f "$dir/munge.key" ]; then
    dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
  fi
  chmod 400 "$dir/munge.key"
  munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" ||
    die "munged did not start ($dir/munged.log)"
  export SLURM_CONF="$conf"
  slurmctld -f "$conf" || die "slurmctld did not start ($dir/slurmctld.log)"
  slurmd -f "$conf" -N "$node" || die "slurmd did not start ($dir/slurmd.log)"
  # Ready when the node is idle (slurmd registered with slurmctld) and a
  # one-task job runs on it (the first may race the registration).
  for _ in $(seq 60); do
    if [ "$(sinfo -h -n "$node" -o %t 2>/dev/null)" = "idle" ] &&
      timeout 20 srun --ntasks=1 --time=1 true >/dev/null 2>&1; then
      echo "one_node.sh: node $node is up ($(nproc) CPUs); export SLURM_CONF=$conf" >&2
      echo "export SLURM_CONF=$conf"
      return 0
    fi
    sleep 0.5
  done
  tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  stop
  die "node $node did not run a job within a minute (logs above)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) SLURM_CONF="$conf" sinfo ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for the launch tests and for trying slurm/*.sbatch
# by hand: munged, slurmctld and NODES slurmd ("n1", "n2", ...; 4 CPUs and 4 fake GPUs each,
# whatever the machine has), with every file under DIR and nothing in /etc.
#
#   slurm_cluster.sh start DIR [NODES]   configure and start (default 2 nodes); then
#                                        export SLURM_CONF=DIR/slurm.conf and use srun, sbatch
#   slurm_cluster.sh stop DIR            cancel the jobs, stop the daemons by their pid files
#
# Needs root and Debian's slurm-wlm and munge (scripts/setup.sh). What it takes to run several
# nodes on one machine is in docs/launching.md ("The test cluster").
set -euo pipefail

nodes=()  # n1 .. nN, set by start

die() { echo "slurm_cluster: $*" >&2; exit 1; }

# A TCP port on 127.0.0.1 that no socket uses (in any state) and that CONF (the slurm.conf
# being written) does not already give to slurmctld or another node: the daemons start only
# after every port is chosen, so a second draw of the same port would pass the socket check.
# Below the kernel's ephemeral range: a port the kernel hands to a socket bound to port 0 or to
# an outgoing connection (Open MPI, ddp's socket ring, another test running beside this one)
# never comes from there, so the port stays free between this check and slurmd's bind.
free_port() {
  local conf=$1 port low
  low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2> /dev/null || echo 32768)
  [ "$low" -gt 20100 ] || low=60000  # an unusual range: take the old chance
  for port in $(shuf -i 20000-$((low - 1)) -n 50); do
    grep -Eqs "Port=$port( |$)" "$conf" && continue
    if [ -z "$(ss -Htan "sport = :$port")" ]; then echo "$port"; return; fi
  done
  die "no free TCP port found on 127.0.0.1"
}

write_config() {
  local dir=$1 node
  mkdir -p "$dir/munge" "$dir/ctld"
  chmod 755 "$dir/munge"
  mungekey -c -k "$dir/munge/munge.key"
  chmod 400 "$dir/munge/munge.key"
  local ctld_port; ctld_port=$(free_port "$dir/slurm.conf")
  cat > "$dir/slurm.conf" <<CONF
ClusterName=ddptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation=$dir/ctld
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
# %n: every emulated node needs its own spool, pid file, log and TmpFS (PMIx puts its
# per-job directory there; shared, the second node fails with "File exists").
SlurmdSpoolDir=$dir/%n/spool
SlurmdPidFile=$dir/%n/slurmd.pid
SlurmdLogFile=$dir/%n/slurmd.log
TmpFS=$dir/%n/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
MpiDefault=pmix
MailProg=/bin/true
# Test-sized timings: schedule a batch job at once, and keep a finished one for only 4 s,
# which also makes sbatch --wait poll every 2 s instead of backing off to 32 s.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MinJobAge=4
# A node whose slurmd stops answering is marked DOWN after this many seconds (Slurm's default
# 300; the node-loss test sets a few seconds through DDP_TEST_SLURMD_TIMEOUT).
SlurmdTimeout=${DDP_TEST_SLURMD_TIMEOUT:-300}
GresTypes=gpu
# Both emulated nodes share one /dev/shm: Open MPI's shared-memory files must not collide.
TaskProlog=$dir/task_prolog.sh
CONF
  echo "AutoDetect=off" > "$dir/gres.conf"
  for node in "${nodes[@]}"; do
    mkdir -p "$dir/$node/spool" "$dir/$node/tmp" "$dir/$node/shm"
    # Fake GPUs: gres needs character devices; /dev/null is one.
    for gpu in 0 1 2 3; do ln -sf /dev/null "$dir/$node/nvidia$gpu"; done
    echo "NodeName=$node NodeAddr=127.0.0.1 Port=$(free_port "$dir/slurm.conf") CPUs=4 Gres=gpu:4 State=UNKNOWN" >> "$dir/slurm.conf"
    echo "NodeName=$node Name=gpu File=$dir/$node/nvidia[0-3]" >> "$dir/gres.conf"
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP" >> "$dir/slurm.conf"
  cat > "$dir/task_prolog.sh" <<PROLOG
#!/bin/sh
echo "export OMPI_MCA_btl_vader_backing_directory=$dir/\$SLURMD_NODENAME/shm"
PROLOG
  chmod 755 "$dir/task_prolog.sh"
}

start() {
  local dir=$1 count=$2 i node tool
  [[ "$count" =~ ^[1-9]$ ]] || die "NODES must be 1..9, not '$count'"
  nodes=()
  for i in $(seq "$count"); do nodes+=("n$i"); done
  [ "$(id -u)" -eq 0 ] || die "needs root (it runs slurmd and munged as root)"
  for tool in munged mungekey slurmctld slurmd sinfo srun; do
    command -v "$tool" > /dev/null || die "$tool not found: install slurm-wlm and munge (scripts/setup.sh)"
  done
  [ ! -e "$dir/slurm.conf" ] || die "$dir already holds a cluster: stop it and remove $dir, or give a new directory"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  write_config "$dir"
  export SLURM_CONF=$dir/slurm.conf
  munged --socket="$dir/munge/munge.socket.2" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed"
  slurmctld -c
  for node in "${nodes[@]}"; do slurmd -N "$node"; done
  # The nodes register within a second or two.
  for i in $(seq 100); do
    if [ "$(sinfo -h -N -o '%t' | grep -c '^idle')" -eq ${#nodes[@]} ]; then
      echo "slurm_cluster: ${nodes[*]} up; export SLURM_CONF=$SLURM_CONF"
      return
    fi
    sleep 0.2
  done
  sinfo -N >&2 || true
  for node in "${nodes[@]}"; do  # the logs go with the test's scratch directory: show them
    echo "--- $node/slurmd.log (last lines)" >&2
    tail -n 5 "$dir/$node/slurmd.log" >&2 2> /dev/null || true
  done
  die "nodes did not become idle within 20 s; logs: $dir/slurmctld.log, $dir/n*/slurmd.log"
}

# Whether the pid file names a live process called NAME (not a recycled pid).
running() {
  local pidfile=$1 name=$2
  [ -s "$pidfile" ] && [ "$(cat "/proc/$(cat "$pidfile")/comm" 2> /dev/null)" = "$name" ]
}

# stop_daemons NAME:PIDFILE...: SIGTERM to each live daemon in the pid files, all at once (each
# takes a second or two to shut down), then SIGKILL to any still there after 10 s.
stop_daemons() {
  local entry name pidfile pid i alive pids=()
  for entry in "$@"; do
    name=${entry%%:*}
    pidfile=${entry#*:}
    running "$pidfile" "$name" || continue
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2> /dev/null && pids+=("$pid")
  done
  for i in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2> /dev/null && alive=1; done
    [ $alive -eq 1 ] || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2> /dev/null || true; done
}

stop() {
  local dir=$1
  [ -f "$dir/slurm.conf" ] || return 0
  export SLURM_CONF=$dir/slurm.conf
  if running "$dir/slurmctld.pid" slurmctld; then
    scancel --full --quiet --user=root 2> /dev/null || true
  fi
  local daemons=(slurmctld:"$dir/slurmctld.pid") pidfile
  for pidfile in "$dir"/n*/slurmd.pid; do daemons+=(slurmd:"$pidfile"); done
  stop_daemons "${daemons[@]}"
  stop_daemons munged:"$dir/munge/munged.pid"  # last: the others authenticate through it
}

case "${1:-}" in
  start) start "${2:?usage: slurm_cluster.sh start DIR [NODES]}" "${3:-2}" ;;
  stop) stop "${2:?usage: slurm_cluster.sh stop DIR}" ;;
  *) die "usage: slurm_cluster.sh start|stop DIR" ;;
esac

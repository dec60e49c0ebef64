#!/usr/bin/env bash
# Runs on the HTCondor execute node (ddp.sub): one ddp rank per GPU HTCondor gave the job, the
# job's CPUs split between the ranks, started with ddprun.
#
#   run_ddp.sh PROGRAM [ARGS...]
#
# HTCondor lists the job's GPUs in CUDA_VISIBLE_DEVICES and sets OMP_NUM_THREADS to its
# request_cpus; left as it is, every rank would start that many threads.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -gt 0 ] || { echo "usage: run_ddp.sh PROGRAM [ARGS...]" >&2; exit 2; }

# ddprun: transferred into the sandbox next to this script, or the repository's copy.
ddprun=$here/ddprun
[ -x "$ddprun" ] || ddprun=$here/../ddprun

gpus=${CUDA_VISIBLE_DEVICES:-}
if [ -z "$gpus" ] || [ "$gpus" = NoDevFiles ]; then
  ranks=1  # no GPU: one rank on the CPU
else
  IFS=, read -ra list <<< "$gpus"
  ranks=${#list[@]}
fi
cpus=${OMP_NUM_THREADS:-$(nproc)}
threads=$(( cpus / ranks > 0 ? cpus / ranks : 1 ))
echo "run_ddp: $(hostname): GPUs '${gpus:-none}' -> $ranks rank(s) x $threads thread(s)"
start=$SECONDS
status=0
"$ddprun" -n "$ranks" -t "$threads" "$@" || status=$?
echo "run_ddp: $((SECONDS - start)) s, exit status $status"
exit $status

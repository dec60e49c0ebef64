#!/usr/bin/env bash
# Usage: bench/waiting_cpu.sh BUILD_DIR [ddp_mnist flags]
# The CPU a rank burns while it waits for a stopped one (docs/records/reliability.md): starts
# ddp_mnist at 2 ranks, sends rank 1 SIGSTOP once rank 0 has logged batch 10, then reports
# rank 0's utime + stime (/proc/PID/stat) over the next 20 s, per thread too, and ends the job.
set -u
build=$1; shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
log=$(mktemp)
nice -n 19 mpirun -np 2 "$build/examples/ddp_mnist" --epochs 1 --log-interval 1 --progress log "$@" > "$log" 2>&1 &
job=$!
for _ in $(seq 1 600); do grep -q "Train Epoch: 1 \[640/" "$log" && break; sleep 0.1; done
rank_pid() { for p in $(pgrep -f "$build/examples/ddp_mnist"); do
  tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo $p; done; }
r0=$(rank_pid 0); r1=$(rank_pid 1)
kill -STOP "$r1"
sleep 1
ticks() { awk '{print $14 + $15}' "$1"; }
threads() { for t in /proc/$r0/task/*; do echo "$(basename $t) $(ticks $t/stat)"; done | sort; }
hz=$(getconf CLK_TCK)
t0=$(ticks /proc/$r0/stat); before=$(threads)
sleep 20
t1=$(ticks /proc/$r0/stat); after=$(threads)
echo "rank 0 used $(echo "scale=2; ($t1 - $t0) / $hz" | bc) s of CPU in 20 s while rank 1 was stopped"
join <(echo "$before") <(echo "$after") | awk -v hz="$hz" '$3 > $2 { printf "  thread %s: %.2f s\n", $1, ($3 - $2) / hz }'
kill -9 "$r1" "$r0" 2>/dev/null; wait $job 2>/dev/null
rm -f "$log"

#!/usr/bin/env bash
# Usage: startup_stall_check.sh mpi-init|mpi-init-timeout|loading-data|shutdown MPIEXEC DDP_MNIST WORK_DIR
# A rank that stalls outside any collective ends the job by the timeout, naming the phase
# (issue 26; <ddp/runtime.h>: WatchedPhase). Rank 1 of 2 stops itself (SIGSTOP) on entering a
# phase (DDP_TEST_STOP_IN_PHASE, which the test build ddp_mnist_signal_at_step reads), as a rank
# on a stuck file system or a stopped node would:
#   mpi-init      in MPI start-up: rank 0 waits in MPI_Init; without --timeout,
#                 DDP_STARTUP_TIMEOUT_SECONDS=5 must end it, rank 0 naming "MPI start-up
#                 (MPI_Init)" and the variable
#   mpi-init-timeout  the same with --timeout 5 and DDP_STARTUP_TIMEOUT_SECONDS=600 (issue 38:
#                 --timeout, when given, bounds start-up too, the start-up default only applies
#                 without it): --timeout must end it within 40 s, rank 0 naming it as the limit
#   loading-data  while loading MNIST, after MPI start-up: rank 0 goes on to the
#                 DistributedDataParallel constructor and waits in MPI_Comm_dup; --timeout 5
#                 must end it, rank 0 naming the communicator's creation in the constructor
#   shutdown      at the end, before MPI_Finalize: rank 0 waits in MPI_Finalize (Open MPI's
#                 waits for every rank); --timeout 5 must end it, naming MPI shutdown
# Both: non-zero, not before the 5 s limit, within 40 s of the start.
set -euo pipefail
mode=$1 mpiexec=$2 ddp_mnist=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

case "$mode" in
  mpi-init) phase="MPI start-up"; expect="rank 0 .*watchdog: MPI start-up \(MPI_Init\) unfinished after [0-9]+ s \(limit 5 s: DDP_STARTUP_TIMEOUT_SECONDS\)" ;;
  mpi-init-timeout) phase="MPI start-up"; expect="rank 0 .*watchdog: MPI start-up \(MPI_Init\) unfinished after [0-9]+ s \(limit 5 s: RuntimeOptions::startup_timeout, --timeout\)" ;;
  loading-data) phase="loading data"; expect="rank 0 .*watchdog: creating a CPU communicator \(MPI_Comm_dup\), in the DistributedDataParallel constructor unfinished after [0-9]+ s \(limit 5 s: ProcessGroupOptions::timeout, --timeout, DDP_TIMEOUT_SECONDS\): every rank of the job must call it" ;;
  shutdown) phase="MPI shutdown"; expect="rank 0 .*watchdog: MPI shutdown \(MPI_Finalize\) unfinished after [0-9]+ s \(limit 5 s" ;;
  *) fail "unknown mode $mode" ;;
esac

# The limits: mpi-init the start-up variable alone, mpi-init-timeout --timeout against a
# start-up variable that would wait 10 minutes, the others both.
startup=5 timeout=(--timeout 5)
case "$mode" in
  mpi-init) timeout=() ;;
  mpi-init-timeout) startup=600 ;;
esac
log="$work/job.log"
started=$(now_ms)
DDP_TEST_STOP_IN_PHASE="1:$phase" DDP_STARTUP_TIMEOUT_SECONDS=$startup \
  "$mpiexec" -np 2 -x DDP_TEST_STOP_IN_PHASE -x DDP_STARTUP_TIMEOUT_SECONDS "$ddp_mnist" \
  --epochs 1 --limit-train-batches 3 --batch-size 32 --log-interval 0 --progress none \
  "${timeout[@]}" > "$log" 2>&1 &
job=$!
while kill -0 $job 2>/dev/null; do
  if [ $(( $(now_ms) - started )) -gt 60000 ]; then
    kill -9 $job 2>/dev/null || true
    pkill -9 -f "$ddp_mnist" || true
    cat "$log"
    fail "the job still ran 60 s after it started"
  fi
  sleep 0.1
done
elapsed=$(( $(now_ms) - started ))
status=0
wait $job || status=$?
cat "$log"
echo "exit status $status after $elapsed ms"
[ "$status" -ne 0 ] || fail "exit status 0"
[ "$elapsed" -ge 5000 ] || fail "ended after $elapsed ms, before the 5 s limit"
[ "$elapsed" -le 40000 ] || fail "ended after $elapsed ms (more than 40 s)"
grep -Eq "$expect" "$log" || fail "no message matching: $expect"
echo "PASS: $mode"

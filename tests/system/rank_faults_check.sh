#!/usr/bin/env bash
# Usage: rank_faults_check.sh stop|kill MPIEXEC DDP_MNIST_SIGNAL_AT_STEP WORK_DIR
# A rank that stops or dies in the middle of training ends the job, naming it
# (docs/reliability.md). The rank raises the signal on itself right after an optimizer step
# (DDP_MNIST_SIGNAL_AT_STEP: ddp_mnist built with tests/system/signal_at_step.cpp, which first prints a
# line this script times the end from):
#   stop  rank 1 of 2 is SIGSTOPped after step 4, with --timeout 5: the job must end non-zero,
#         at least 5 s and at most 30 s after the stop, with the MPI watchdog's message naming
#         the all-reduce, its sequence number, rank 0 that timed out and rank 1 as never arrived
#   kill  a rank chosen from a seed (printed; DDP_FAULT_SEED=N repeats a run) is killed with
#         SIGKILL after a step chosen from the same seed, at 3 ranks: the job must end non-zero
#         within 30 s of the kill, and mpirun's message must name that rank and signal 9
set -euo pipefail
mode=$1 mpiexec=$2 ddp_mnist=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

case "$mode" in
  stop)
    ranks=2 rank=1 step=4 signal=STOP
    extra=(--timeout 5)
    ;;
  kill)
    seed=${DDP_FAULT_SEED:-$(( $(date +%s%N) % 1000000 ))}
    ranks=3 rank=$(( seed % 3 )) step=$(( 2 + (seed / 3) % 8 )) signal=KILL
    extra=()
    echo "seed $seed: rank $rank is killed after step $step (repeat with DDP_FAULT_SEED=$seed)"
    ;;
  *) fail "unknown mode $mode" ;;
esac

log="$work/job.log"
"$mpiexec" -np $ranks "$ddp_mnist" --signal-at-step=$step:$rank:$signal --epochs 1 \
  --limit-train-batches 30 --batch-size 32 --log-interval 0 --progress none "${extra[@]}" \
  > "$log" 2>&1 &
job=$!
# The moment the rank signals itself, then the job's end (bounded: 90 s in all).
signalled=""
deadline=$(( $(now_ms) + 90000 ))
while kill -0 $job 2>/dev/null; do
  if [ -z "$signalled" ] && grep -q "signal_at_step: rank $rank raises" "$log"; then
    signalled=$(now_ms)
  fi
  if [ "$(now_ms)" -gt "$deadline" ]; then
    kill -9 $job 2>/dev/null || true
    cat "$log"
    fail "the job still ran 90 s after it started"
  fi
  sleep 0.1
done
ended=$(now_ms)
status=0
wait $job || status=$?
cat "$log"
[ -n "$signalled" ] || grep -q "signal_at_step: rank $rank raises" "$log" ||
  fail "rank $rank never reached step $step"
[ -n "$signalled" ] || signalled=$ended
elapsed=$(( ended - signalled ))
echo "exit status $status; the job ended $elapsed ms after rank $rank raised SIG$signal (after step $step)"
[ "$status" -ne 0 ] || fail "the job exited 0"
[ "$elapsed" -le 30000 ] || fail "the job took more than 30 s to end after the signal"

case "$mode" in
  stop)
    # Within the 100 ms the line takes to be seen, the watchdog cannot fire before 5 s.
    [ "$elapsed" -ge 4800 ] || fail "ended before --timeout 5 could have fired: not the watchdog"
    grep -Eq "ddp: rank 0 .*MPI watchdog on rank 0: all_reduce #[0-9]+ .* unfinished 5 s after rank 0 entered it .*Ranks that never arrived: rank 1 \(no answer within 2 s" "$log" ||
      fail "no watchdog message naming the all-reduce, its number, rank 0 and rank 1"
    ;;
  kill)
    grep -Eq "process rank $rank with PID [0-9]+ on node .* exited on signal 9" "$log" ||
      fail "mpirun's message does not name rank $rank killed by signal 9"
    ;;
esac
echo "PASS"

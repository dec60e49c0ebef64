#!/usr/bin/env bash
# Usage: stop_exit_check.sh CASE MPIEXEC DDP_CIFAR DDP_CIFAR_SIGNAL_AT_STEP COMPARE_MODELS STALL_WRITE_LIB DATA_DIR WORK_DIR
# A stop signal at any phase of a job's life ends it with status 75 (a requeue resumes it) when
# the job can resume (issue 26; docs/reliability.md). 2 ranks of ddp_cifar on the synthetic
# data set, 1 epoch of 4 steps; each case's resumed run must end bit-identical to the same run
# uninterrupted. DDP_CIFAR_SIGNAL_AT_STEP is ddp_cifar built to raise a signal at a known point
# (tests/system/signal_at_step.cpp). Cases:
#   start-init    rank 1 raises SIGUSR1 inside MPI_Init_thread: every rank stops before training
#                 (nothing to save), status 75; the same command with --resume trains it all.
#                 Before: rank 1 died of SIGUSR1, status 138.
#   start-setup   rank 0 raises SIGTERM after data loading and the DistributedDataParallel
#                 constructor, before the Trainer exists: the Trainer's first check stops every
#                 rank before step 1, status 75; --resume continues. Before: 143.
#   second-term   SIGTERM to both ranks after step 1 (signal_at_step on rank 1, then the test to
#                 both), a second SIGTERM to both while rank 0 writes the stop's snapshot (held
#                 half-way by STALL_WRITE_LIB until the test lets it go), and a third once rank 0
#                 has said "Exit status 75" (while the ranks finish: the Trainer, and before the
#                 fix its handlers, are gone): status 75, the snapshot complete, --resume from it
#                 bit-identical. Before: 143 for the signal after the snapshot.
set -euo pipefail
case_=$1 mpiexec=$2 ddp_cifar=$3 signal_at_step=$4 compare=$5 stall=$6 data=$7 work=$8/$1
rm -rf "$work" && mkdir -p "$work"
flags=(--data-dir "$data" --model cnn --epochs 1 --batch-size 32 --limit-train-batches 4
       --test-batch-size 256 --keep-checkpoints 0 --log-interval 1 --progress log)
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line of $1 matches: $2"; }; }
# Waits (up to 60 s) for a line of file $1 matching $2.
wait_for() {
  for _ in $(seq 6000); do grep -Eq -- "$2" "$1" 2> /dev/null && return 0; sleep 0.01; done
  fail "60 s without a line matching $2 in $1"
}

echo "== uninterrupted"
"$mpiexec" -np 2 "$ddp_cifar" "${flags[@]}" --checkpoint-dir "$work/full" > "$work/full.log" 2>&1 ||
  { cat "$work/full.log"; fail "the uninterrupted run failed"; }
resume_matches() {  # $1: the stopped run's checkpoint directory
  "$mpiexec" -np 2 "$ddp_cifar" "${flags[@]}" --checkpoint-dir "$1" --resume > "$1.resumed.log" 2>&1 ||
    { cat "$1.resumed.log"; fail "the resumed run failed"; }
  "$compare" "$work/full/model_with_epoch1.pt" "$1/model_with_epoch1.pt"
}

status=0
case $case_ in
start-init|start-setup)
  if [ "$case_" = start-init ]; then
    at=init:1:USR1 raised="rank 1 raises signal 10 inside MPI_Init_thread"
    stopped="^Stopped by SIGUSR1 \(rank 1\) during start-up, before training: nothing to save$"
  else
    at=setup:0:TERM raised="rank 0 raises signal 15 before the Trainer"
    stopped="^Stopped by SIGTERM \(rank 0\) before batch 0 of epoch 1 \(step 0\): wrote "
  fi
  "$mpiexec" -np 2 "$signal_at_step" --signal-at-step=$at "${flags[@]}" \
    --checkpoint-dir "$work/ck" > "$work/job.log" 2>&1 || status=$?
  cat "$work/job.log"
  expect "$work/job.log" "^signal_at_step: $raised"
  [ $status -eq 75 ] || fail "exit status $status, expected 75"
  expect "$work/job.log" "$stopped"
  ! grep -q "^Train Epoch" "$work/job.log" || fail "it trained after the signal"
  resume_matches "$work/ck"
  ;;
second-term)
  marker=$work/stalled release=$work/release
  "$mpiexec" -np 2 -x LD_PRELOAD="$stall" -x DDP_STALL_WRITE_TO=snapshot_epoch1_batch2.pt.tmp. \
    -x DDP_STALL_MARKER="$marker" -x DDP_STALL_UNTIL="$release" \
    "$signal_at_step" --signal-at-step=1:1:TERM "${flags[@]}" --checkpoint-dir "$work/ck" \
    > "$work/job.log" 2>&1 &
  job=$!
  wait_for "$work/job.log" "^signal_at_step: rank 1 raises"
  ranks=$(pgrep -P $job | tr '\n' ' ')
  kill -TERM $ranks  # as Slurm does: every rank
  for _ in $(seq 6000); do [ -s "$marker" ] && break; sleep 0.01; done
  [ -s "$marker" ] || { kill -9 $job; fail "the snapshot write never started (60 s)"; }
  kill -TERM $ranks  # the second, during the write
  sleep 0.5          # delivered at once; a default action would have killed by now
  touch "$release"
  wait_for "$work/job.log" "^Exit status 75"
  kill -TERM $ranks 2> /dev/null || true  # the third, while the ranks finish
  wait $job || status=$?
  cat "$work/job.log"
  [ $status -eq 75 ] || fail "exit status $status, expected 75"
  expect "$work/job.log" "^Stopped by SIGTERM \(rank [01]\) before batch 2 of epoch 1 \(step 2\): wrote $work/ck/snapshot_epoch1_batch2.pt"
  [ -z "$(find "$work/ck" -name '*.tmp.*')" ] || fail "a temporary file was left: the write did not finish"
  resume_matches "$work/ck"
  expect "$work/ck.resumed.log" "^Resumed from $work/ck/snapshot_epoch1_batch2.pt"
  ;;
*) fail "unknown case $case_" ;;
esac
echo "stop_exit_check $case_: passed (status 75, resumed bit-identical)"

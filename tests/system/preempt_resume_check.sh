#!/usr/bin/env bash
# Usage: preempt_resume_check.sh MPIEXEC DDP_CIFAR DDP_CIFAR_SIGNAL_AT_STEP COMPARE_MODELS DATA_DIR WORK_DIR
# Preemption and resume at 2 ranks (docs/reliability.md), each against the same run
# uninterrupted (2 epochs of 6 steps: steps 1-6 in epoch 1, 7-12 in epoch 2). DDP_CIFAR_SIGNAL_AT_STEP
# is ddp_cifar built to raise a signal at a known step (tests/system/signal_at_step.cpp):
#   1. SIGTERM on rank 1 only, right after step 8 (--signal-at-step=8:1:TERM): both ranks stop
#      a boundary later (the agreement is read at the next one), before batch 3 of epoch 2, write snapshot_epoch2_batch3.pt, exit 75; --resume continues
#      from step 9 and ends bit-identical (model, metrics of epoch 2); the metrics file of the
#      stopped run keeps its epoch-1 line and the resumed run appends;
#   2. --checkpoint-every-steps 4 and a SIGKILL of rank 1 after step 10 (a crash with no
#      warning): resume from the snapshot of step 8 is bit-identical;
#   3. SIGUSR1 sent to mpirun (what sbatch --signal and scancel --signal do), which forwards it
#      to the ranks: exit 75, a snapshot inside an epoch, resume bit-identical.
set -euo pipefail
mpiexec=$1 ddp_cifar=$2 signal_at_step=$3 compare=$4 data=$5 work=$6
rm -rf "$work" && mkdir -p "$work"
flags=(--data-dir "$data" --model cnn --epochs 2 --batch-size 32 --limit-train-batches 6
       --test-batch-size 256 --keep-checkpoints 0)
train=("$mpiexec" -np 2 "$ddp_cifar" "${flags[@]}")
# signalled STEP:RANK:SIGNAL FLAGS...: the same run, rank RANK raising SIGNAL after step STEP.
signalled() { local at=$1; shift; "$mpiexec" -np 2 "$signal_at_step" --signal-at-step="$at" "${flags[@]}" "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line of $1 matches: $2"; }; }
# the JSON field $2 of line $3 of metrics file $1, as written
field() { sed -n "${3}p" "$1" | grep -Eo "\"$2\": ?[^,}]+" ; }

echo "== uninterrupted; a stale metrics file is started afresh"
echo '{"epoch": 7, "stale": true}' > "$work/full.jsonl"
"${train[@]}" --log-interval 0 --checkpoint-dir "$work/full" --metrics-file "$work/full.jsonl" > "$work/full.log"
[ "$(wc -l < "$work/full.jsonl")" -eq 2 ] || fail "a fresh run must start a new metrics file: $(cat "$work/full.jsonl")"

echo "== 1. SIGTERM on rank 1 after step 8"
status=0
signalled 8:1:TERM --log-interval 0 --checkpoint-dir "$work/term" \
  --metrics-file "$work/term.jsonl" > "$work/term.log" 2>&1 || status=$?
cat "$work/term.log"
[ $status -eq 75 ] || fail "exit status $status, expected 75"
expect "$work/term.log" "^Stopped by SIGTERM \(rank 1\) before batch 3 of epoch 2 \(step 9\): wrote $work/term/snapshot_epoch2_batch3.pt [0-9.]+ s after the signal"
expect "$work/term.log" "^Exit status 75: stopped early by SIGTERM; continue with the same command and --resume"
[ -f "$work/term/snapshot_epoch2_batch3.pt" ] || fail "no snapshot"
[ ! -f "$work/term/model_with_epoch2.pt" ] || fail "epoch 2 must not have ended"
[ "$(wc -l < "$work/term.jsonl")" -eq 1 ] || fail "the stopped run has epoch 1's metrics only"
"${train[@]}" --log-interval 0 --checkpoint-dir "$work/term" --metrics-file "$work/term.jsonl" --resume > "$work/term-resumed.log"
expect "$work/term-resumed.log" "^Resumed from $work/term/snapshot_epoch2_batch3.pt: epoch 1 done, 3 batches of epoch 2, step 9$"
"$compare" "$work/full/model_with_epoch2.pt" "$work/term/model_with_epoch2.pt"
[ "$(wc -l < "$work/term.jsonl")" -eq 2 ] || fail "the resumed run appends epoch 2: $(cat "$work/term.jsonl")"
for f in train_loss test_loss test_accuracy samples; do
  [ "$(field "$work/full.jsonl" $f 2)" = "$(field "$work/term.jsonl" $f 2)" ] ||
    fail "epoch 2's $f: $(field "$work/full.jsonl" $f 2) uninterrupted, $(field "$work/term.jsonl" $f 2) resumed"
done
[ ! -f "$work/term/snapshot_epoch2_batch3.pt" ] || fail "the epoch-end snapshot supersedes the one inside the epoch"

echo "== 2. --checkpoint-every-steps 4, rank 1 killed after step 10"
status=0
signalled 10:1:KILL --log-interval 0 --checkpoint-dir "$work/crash" \
  --checkpoint-every-steps 4 > "$work/crash.log" 2>&1 || status=$?
[ $status -ne 0 ] || fail "the killed job exited 0"
ls "$work/crash"
[ -f "$work/crash/snapshot_epoch2_batch2.pt" ] || fail "no snapshot of step 8 (epoch 2, batch 2)"
[ ! -f "$work/crash/snapshot_epoch1_batch4.pt" ] || fail "the older snapshot of step 4 was kept"
"${train[@]}" --log-interval 0 --checkpoint-dir "$work/crash" --resume > "$work/crash-resumed.log"
expect "$work/crash-resumed.log" "^Resumed from $work/crash/snapshot_epoch2_batch2.pt: epoch 1 done, 2 batches of epoch 2, step 8$"
"$compare" "$work/full/model_with_epoch2.pt" "$work/crash/model_with_epoch2.pt"

echo "== 3. SIGUSR1 to mpirun, once rank 0 has logged its first step"
"${train[@]}" --log-interval 1 --progress log --checkpoint-dir "$work/usr1" > "$work/usr1.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "^Train Epoch: 1 " "$work/usr1.log" && break
  sleep 0.05
done
kill -USR1 "$pid"
status=0
wait "$pid" || status=$?
cat "$work/usr1.log"
[ $status -eq 75 ] || fail "exit status $status, expected 75"
expect "$work/usr1.log" "^Stopped by SIGUSR1 \(rank [01]\) before batch [0-9]+ of epoch [12] \(step [0-9]+\): wrote $work/usr1/snapshot_epoch[12]_batch[0-9]+.pt"
"${train[@]}" --log-interval 0 --checkpoint-dir "$work/usr1" --resume > "$work/usr1-resumed.log"
expect "$work/usr1-resumed.log" "^Resumed from $work/usr1/snapshot_epoch"
"$compare" "$work/full/model_with_epoch2.pt" "$work/usr1/model_with_epoch2.pt"
echo "preemption check passed"

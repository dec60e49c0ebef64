#!/usr/bin/env bash
# Usage: snapshot_cost_check.sh MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP COMPARE_MODELS WORK_DIR
# --checkpoint-every-seconds at 2 ranks (issue 25), each run against the same run uninterrupted
# (2 epochs of 8 steps: steps 1-8 in epoch 1, 9-16 in epoch 2). The timer's moment is made
# certain by a slow step on one rank: DDP_MNIST_SIGNAL_AT_STEP (tests/system/signal_at_step.cpp) sleeps
# 2.5 s on rank 1 after step 3, so with --checkpoint-every-seconds 2 rank 1's timer is due at the
# boundary after step 3 while rank 0's is not (it waits in the stop check's all-reduce): a
# snapshot of step 3 is written only if the ranks agree.
#   1. the timed run ends like the uninterrupted one (bit-identical weights) and its summary says
#      how many snapshots it wrote: the epoch ends' count is the files left (--keep-checkpoints
#      0), and at least one inside an epoch;
#   2. the same, rank 1 killed after step 5: the newest snapshot is a timed one of step 3 or later
#      (never an epoch end: epoch 1 has 8 steps), and the run resumed from it ends bit-identical.
set -euo pipefail
mpiexec=$1 ddp_mnist=$2 signal_at_step=$3 compare=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
flags=(--epochs 2 --batch-size 64 --limit-train-batches 8 --test-batch-size 1000
       --keep-checkpoints 0 --log-interval 0 --progress none)
train=("$mpiexec" -np 2 "$ddp_mnist" "${flags[@]}")
slow=(--signal-at-step=3:1:SLEEP2.5)
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line of $1 matches: $2"; }; }
summary='^Snapshots: ([0-9]+) written \(([0-9]+) inside epochs, ([0-9]+) at epoch ends\), [0-9.]+ s in all, mean [0-9.]+ ms, max [0-9.]+ ms: [0-9.]+% of [0-9.]+ s of training$'

echo "== uninterrupted, epoch-end snapshots only"
"${train[@]}" --checkpoint-dir "$work/full" > "$work/full.log"
expect "$work/full.log" "^Snapshots: 2 written \(0 inside epochs, 2 at epoch ends\), "

echo "== 1. --checkpoint-every-seconds 2, rank 1 slow after step 3"
"$mpiexec" -np 2 "$signal_at_step" "${slow[@]}" "${flags[@]}" --checkpoint-dir "$work/timed" \
  --checkpoint-every-seconds 2 > "$work/timed.log" 2>&1 || { cat "$work/timed.log"; fail "the timed run failed"; }
expect "$work/timed.log" "$summary"
line=$(grep -E "$summary" "$work/timed.log")
echo "$line"
written=$(sed -E "s/$summary/\1/" <<< "$line")
inside=$(sed -E "s/$summary/\2/" <<< "$line")
ends=$(sed -E "s/$summary/\3/" <<< "$line")
[ $((inside + ends)) -eq "$written" ] || fail "$inside + $ends is not $written"
[ "$inside" -ge 1 ] || fail "no timed snapshot inside an epoch, although rank 1's timer was due after step 3"
files=$(ls "$work/timed" | grep -Ec '^snapshot_epoch[0-9]+\.pt$')
[ "$files" -eq "$ends" ] || fail "the summary counts $ends epoch-end snapshots, the directory holds $files: $(ls "$work/timed")"
[ -z "$(ls "$work/timed" | grep _batch)" ] || fail "the epoch ends supersede the snapshots inside epochs: $(ls "$work/timed")"
"$compare" "$work/full/model_with_epoch2.pt" "$work/timed/model_with_epoch2.pt"

echo "== 2. the same, rank 1 killed after step 5; resume from the timed snapshot"
status=0
"$mpiexec" -np 2 "$signal_at_step" "${slow[@]}" --signal-at-step=5:1:KILL "${flags[@]}" \
  --checkpoint-dir "$work/crash" --checkpoint-every-seconds 2 > "$work/crash.log" 2>&1 || status=$?
[ $status -ne 0 ] || { cat "$work/crash.log"; fail "the killed job exited 0"; }
ls "$work/crash"
newest=$(ls "$work/crash" | grep -E '^snapshot_epoch1_batch[0-9]+\.pt$' || true)
[ "$(wc -w <<< "$newest")" -eq 1 ] || fail "expected one timed snapshot in epoch 1, found: $newest"
batch=$(sed -E 's/^snapshot_epoch1_batch([0-9]+)\.pt$/\1/' <<< "$newest")
[ "$batch" -ge 3 ] && [ "$batch" -le 5 ] || fail "the timed snapshot is of step $batch, expected 3 to 5"
[ ! -f "$work/crash/snapshot_epoch1.pt" ] || fail "epoch 1 must not have ended"
"${train[@]}" --checkpoint-dir "$work/crash" --resume > "$work/crash-resumed.log"
expect "$work/crash-resumed.log" "^Resumed from $work/crash/$newest: epoch 0 done, $batch batches of epoch 1, step $batch$"
"$compare" "$work/full/model_with_epoch2.pt" "$work/crash/model_with_epoch2.pt"
echo "snapshot cost check passed (a timed snapshot of step $batch)"

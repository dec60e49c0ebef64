#!/usr/bin/env bash
# Usage: tensorboard_check.sh MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP PYTHON WORK_DIR
# Step records and TensorBoard (issue 41), ddp_mnist at 2 ranks, 2 epochs of 6 steps (steps 1-6
# in epoch 1, 7-12 in epoch 2), each run checked by tensorboard_metrics_check.py (TensorBoard's
# own reader: every step and epoch number of the metrics file, and only those, in the event
# files, equal as float32; the flags among the hparams):
#   1. a fresh run, a step record every 2 batches (steps 1, 3, 5, 7, 9, 11), with clipping (so
#      a gradient norm);
#   2. a crash after the step snapshot of step 8 (rank 1 killed after step 10, a step record
#      every batch), then --resume: the metrics file drops the step records the crashed run
#      wrote after its snapshot, TensorBoard drops them on the resumed run's restart mark, and
#      both hold steps 1..12 once each.
set -euo pipefail
mpiexec=$1 mnist=$2 signal_at_step=$3 python=$4 work=$5
check=$(dirname "$0")/tensorboard_metrics_check.py
rm -rf "$work" && mkdir -p "$work"
flags=(--epochs 2 --batch-size 32 --limit-train-batches 6 --test-batch-size 1000 --clip-grad-norm 5
       --progress none --no-cuda)
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== 1. a fresh run"
"$mpiexec" -np 2 "$mnist" "${flags[@]}" --log-interval 2 --metrics-file "$work/fresh.jsonl" \
  --tensorboard "$work/fresh" > "$work/fresh.log"
"$python" "$check" "$work/fresh.jsonl" "$work/fresh" --steps 1,3,5,7,9,11 --epochs 2 \
  --hparam batch-size=32 --hparam clip-grad-norm=5 --hparam amp=off --hparam overlap-step=false
grep -q '"grad_norm"' "$work/fresh.jsonl" || fail "no gradient norm in the step records (clipping)"

echo "== 2. killed after step 10 (snapshot at step 8), then --resume"
status=0
"$mpiexec" -np 2 "$signal_at_step" --signal-at-step=10:1:KILL "${flags[@]}" --log-interval 1 \
  --checkpoint-dir "$work/ck" --checkpoint-every-steps 4 --metrics-file "$work/crash.jsonl" \
  --tensorboard "$work/crash" > "$work/crash.log" 2>&1 || status=$?
[ $status -ne 0 ] || { cat "$work/crash.log"; fail "the killed run exited 0"; }
grep -q '"step":9,' "$work/crash.jsonl" || fail "the crashed run wrote no step record after its snapshot: $(cat "$work/crash.jsonl")"
"$mpiexec" -np 2 "$mnist" "${flags[@]}" --log-interval 1 --checkpoint-dir "$work/ck" --resume \
  --metrics-file "$work/crash.jsonl" --tensorboard "$work/crash" > "$work/resumed.log"
grep -q "^Resumed from $work/ck/snapshot_epoch2_batch2.pt" "$work/resumed.log" ||
  { cat "$work/resumed.log"; fail "not resumed from the snapshot of step 8"; }
[ "$(ls "$work/crash" | wc -l)" -eq 2 ] || fail "expected 2 event files: $(ls "$work/crash")"
"$python" "$check" "$work/crash.jsonl" "$work/crash" --steps "$(seq -s, 1 12)" --epochs 2
echo "tensorboard_check: OK"

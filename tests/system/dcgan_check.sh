#!/usr/bin/env bash
# Usage: dcgan_check.sh MPIEXEC DDP_DCGAN WORK_DIR
# examples/ddp_dcgan.cpp (PyTorch's C++ DCGAN ported: two wrappers, no_sync on the
# discriminator in the generator's step, one snapshot of both models and both optimizers) on
# the CPU, 2 epochs of 6 steps on 512 Fashion-MNIST images (DDP_MNIST_DIR), every run comparing
# its models through --params-dir (every rank's parameters and buffers, raw bytes):
#   1. 2 ranks: both ranks' replicas are bit-identical at the end (both models); rank 0's
#      sample images (through the module, on rank 0 alone) were written; each step all-reduced
#      the discriminator's gradients twice, not three times (no_sync in the generator's step);
#   2. 2 ranks with --same-data (every rank trains rank 0's batches with rank 0's noise) equal
#      a 1-rank run bit for bit: the gradient averaging of both models changes nothing;
#   3. rank 1 raises SIGTERM after step 2 (--stop-at-step): the ranks agree at the next
#      boundary and stop at the one after
#      boundary, exit status 75 after a snapshot inside epoch 1; the same command with --resume
#      ends bit-identical to 1; once more, it has nothing left to train (status 0, said);
#   4. a bad flag ends every rank with status 2 and a line naming it.
set -euo pipefail
mpiexec=$1 program=$2 work=$3
rm -rf "$work" && mkdir -p "$work/data"
/usr/bin/python3 "$(dirname "$0")/mnist_subset.py" "${DDP_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" "$work/data" 512 16
train=(--data-dir "$work/data" --epochs 2 --batch-size 16 --limit-train-batches 6 --log-interval 3
       --workers 2 --seed 3 --no-cuda)
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line of $1 matches: $2"; }; }
# run RANKS NAME FLAGS...: a run that must end with status 0, its parameters in $work/NAME.
run() {
  local ranks=$1 name=$2
  shift 2
  local status=0
  "$mpiexec" -np "$ranks" "$program" "${train[@]}" --params-dir "$work/$name" "$@" > "$work/$name.log" 2>&1 ||
    status=$?
  [ "$status" -eq 0 ] || { cat "$work/$name.log"; fail "$name: exit status $status"; }
  expect "$work/$name.log" "^Training complete after step 12: generator [0-9a-f]{16}, discriminator [0-9a-f]{16}$"
}
same() { cmp -s "$1" "$2" || fail "$1 and $2 differ"; }

echo "== 1. 2 ranks: the replicas are bit-identical"
run 2 full --checkpoint-dir "$work/full_ckpt" --sample-every 4 --sample-dir "$work/samples"
same "$work/full/rank0.bin" "$work/full/rank1.bin"
for step in 4 8 12; do
  head -c 2 "$work/samples/dcgan-sample-$step.pgm" | grep -q P5 || fail "no sample image at step $step"
done
for f in generator_with_epoch2.pt discriminator_with_epoch2.pt snapshot_epoch2.pt; do
  test -f "$work/full_ckpt/$f" || fail "no $work/full_ckpt/$f"
done
grep "^Training complete\|^Gradients" "$work/full.log"
# no_sync(): the discriminator's gradients are averaged in its two backwards, not in the
# generator's; the generator's once.
expect "$work/full.log" "^Gradients all-reduced per step: generator 1.00x its parameters, discriminator 2.00x$"

echo "== 2. 2 ranks on the same data equal 1 rank"
run 1 one
run 2 same_data --same-data
same "$work/one/rank0.bin" "$work/same_data/rank0.bin"
same "$work/one/rank0.bin" "$work/same_data/rank1.bin"
# ... and the 2 ranks on their own shards trained another model (the check can fail).
cmp -s "$work/one/rank0.bin" "$work/full/rank0.bin" && fail "2 ranks on their shards equal 1 rank"
grep "Training complete" "$work/one.log"

echo "== 3. SIGTERM on rank 1 after step 3: exit 75, then --resume equals 1"
status=0
"$mpiexec" -np 2 "$program" "${train[@]}" --checkpoint-dir "$work/stopped_ckpt" \
  --stop-at-step 2 --stop-rank 1 > "$work/stopped.log" 2>&1 || status=$?
[ "$status" -eq 75 ] || { cat "$work/stopped.log"; fail "exit status $status, expected 75"; }
expect "$work/stopped.log" "^Stopped by SIGTERM \(rank 1\) before batch 3 of epoch 1 \(step 3\): wrote $work/stopped_ckpt/snapshot_epoch1_batch3.pt"
grep "^Stopped by" "$work/stopped.log"
run 2 resumed --checkpoint-dir "$work/stopped_ckpt" --resume
expect "$work/resumed.log" "^Resumed from $work/stopped_ckpt/snapshot_epoch1_batch3.pt: epoch 0 done, 3 batches of epoch 1, step 3$"
same "$work/full/rank0.bin" "$work/resumed/rank0.bin"
same "$work/full/rank1.bin" "$work/resumed/rank1.bin"
# Issue 60: the same command once more has nothing left to train: status 0, said.
run 2 again --checkpoint-dir "$work/stopped_ckpt" --resume
expect "$work/again.log" "^Nothing left to train: $work/stopped_ckpt/snapshot_epoch2.pt is the end of epoch 2 \(step 12\), and this run ends at epoch 2: the run is complete; give more epochs to train on$"

echo "== 4. a bad flag: status 2, one line naming it"
status=0
"$mpiexec" -np 2 "$program" --sample-every 0 > "$work/bad.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || { cat "$work/bad.log"; fail "exit status $status, expected 2"; }
expect "$work/bad.log" "^ddp_dcgan: --sample-every must be >= 1 \(got 0\) \(see --help\)$"
echo "dcgan check passed"

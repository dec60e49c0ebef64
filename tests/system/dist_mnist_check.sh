#!/usr/bin/env bash
# Usage: dist_mnist_check.sh MPIEXEC DDP_DIST_MNIST WORK_DIR
# examples/ddp_dist_mnist.cpp (PyTorch's c10d dist-mnist.cpp ported: one wrapper instead of the
# per-parameter all-reduce, PyTorch's DistributedSampler, one snapshot of the model and its
# optimizer) on the CPU, 2 epochs of 6 steps on 384 Fashion-MNIST images (DDP_MNIST_DIR) and
# 64 test images, every run comparing its model through --params-dir (every rank's parameters,
# raw bytes):
#   1. 2 ranks: both ranks' replicas are bit-identical at the end; every test image was
#      evaluated once over the ranks (each its shard, the sums reduced);
#   2. 2 ranks with --same-data (every rank trains rank 0's batches, the same dropout masks)
#      equal a 1-rank run bit for bit: the gradient averaging changes nothing; 2 ranks on their
#      own shards do not;
#   3. rank 1 raises SIGTERM after step 2 (--stop-at-step): the ranks agree at the next
#      boundary and stop at the one after
#      boundary, exit status 75 after a snapshot inside epoch 1; the same command with --resume
#      ends bit-identical to 1; once more, it has nothing left to train (status 0, said); a
#      SIGTERM after the last step leaves the run complete (status 0, said);
#   4. a bad flag ends every rank with status 2 and a line naming it.
set -euo pipefail
mpiexec=$1 program=$2 work=$3
rm -rf "$work" && mkdir -p "$work/data"
/usr/bin/python3 "$(dirname "$0")/mnist_subset.py" "${DDP_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" "$work/data" 384 64
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
  expect "$work/$name.log" "^Test set: 64 images, loss [0-9.]+, accuracy [0-9.]+%$"
  expect "$work/$name.log" "^Training complete after step 12: model [0-9a-f]{16}$"
}
same() { cmp -s "$1" "$2" || fail "$1 and $2 differ"; }

echo "== 1. 2 ranks: the replicas are bit-identical"
run 2 full --checkpoint-dir "$work/full_ckpt"
same "$work/full/rank0.bin" "$work/full/rank1.bin"
for f in model_with_epoch2.pt snapshot_epoch2.pt; do
  test -f "$work/full_ckpt/$f" || fail "no $work/full_ckpt/$f"
done
grep "^Epoch\|^Test set\|^Training complete" "$work/full.log"

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
# The resumed epoch's accuracy counts its first 3 steps too (RankState::values): the same
# epoch lines as the uninterrupted run.
diff <(grep "^Epoch" "$work/full.log") <(grep "^Epoch" "$work/resumed.log") ||
  fail "the resumed run's epoch lines differ from the uninterrupted run's"
# Issue 60: the same command once more has nothing left to train (status 0, said); a SIGTERM
# after the run's last step leaves the run complete (status 0, said).
run 2 again --checkpoint-dir "$work/stopped_ckpt" --resume
expect "$work/again.log" "^Nothing left to train: $work/stopped_ckpt/snapshot_epoch2.pt is the end of epoch 2 \(step 12\), and this run ends at epoch 2: the run is complete; give more epochs to train on$"
run 2 late --checkpoint-dir "$work/late_ckpt" --stop-at-step 12 --stop-rank 1
expect "$work/late.log" "^SIGTERM \(rank 1\) came after the run's last step: the run is complete \(saved $work/late_ckpt/snapshot_epoch2.pt\); nothing is left to resume$"
same "$work/full/rank0.bin" "$work/late/rank0.bin"
grep "^Nothing left\|^SIGTERM" "$work/again.log" "$work/late.log"

echo "== 4. a bad flag: status 2, one line naming it"
status=0
"$mpiexec" -np 2 "$program" --batch-size 0 > "$work/bad.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || { cat "$work/bad.log"; fail "exit status $status, expected 2"; }
expect "$work/bad.log" "^ddp_dist_mnist: --batch-size must be >= 1 \(got 0\) \(see --help\)$"
echo "dist-mnist check passed"

#!/usr/bin/env bash
# Usage: cifar_resume_check.sh MPIEXEC DDP_CIFAR COMPARE_MODELS DATA_DIR WORK_DIR
# A 2-rank ddp_cifar run stopped after epoch 1 and resumed ends bit-identical to the same run
# uninterrupted; a damaged newest snapshot is refused naming it, or skipped with
# --resume-fallback; resuming on another number of ranks works and warns.
set -euo pipefail
mpiexec=$1 ddp_cifar=$2 compare=$3 data=$4 work=$5
rm -rf "$work" && mkdir -p "$work/full" "$work/resumed"
train=("$mpiexec" -np 2 "$ddp_cifar" --data-dir "$data" --model cnn --epochs 2 --batch-size 32
       --limit-train-batches 6 --log-interval 0 --test-batch-size 256 --keep-checkpoints 0)

echo "== uninterrupted: 2 epochs"
"${train[@]}" --checkpoint-dir "$work/full"

echo "== stopped after epoch 1 (its snapshot), then resumed with the same command"
cp "$work/full/snapshot_epoch1.pt" "$work/resumed/"
"${train[@]}" --checkpoint-dir "$work/resumed" --resume | tee "$work/resumed.log"
grep -q "Resumed from $work/resumed/snapshot_epoch1.pt: epoch 1 done" "$work/resumed.log"
"$compare" "$work/full/model_with_epoch2.pt" "$work/resumed/model_with_epoch2.pt"

echo "== a damaged newest snapshot"
mkdir -p "$work/damaged"
cp "$work/full/snapshot_epoch1.pt" "$work/damaged/"
head -c 1000 "$work/full/snapshot_epoch2.pt" > "$work/damaged/snapshot_epoch2.pt"
if "${train[@]}" --checkpoint-dir "$work/damaged" --resume > "$work/damaged.log" 2>&1; then
  echo "resuming from a truncated snapshot succeeded" >&2; exit 1
fi
grep -q "$work/damaged/snapshot_epoch2.pt: truncated" "$work/damaged.log"
"${train[@]}" --checkpoint-dir "$work/damaged" --resume --resume-fallback > "$work/fallback.log" 2>&1
grep -q "trying the previous snapshot" "$work/fallback.log"
grep -q "Resumed from $work/damaged/snapshot_epoch1.pt" "$work/fallback.log"
"$compare" "$work/full/model_with_epoch2.pt" "$work/damaged/model_with_epoch2.pt"
echo "== the 2-rank snapshot resumed by one process"
mkdir -p "$work/one"
cp "$work/full/snapshot_epoch1.pt" "$work/one/"
"$(dirname "$ddp_cifar")/cifar" "${train[@]:4}" --checkpoint-dir "$work/one" --resume > "$work/one.log" 2>&1
grep -q "the snapshot was written by 2 rank(s), this run has 1: the data order differs" "$work/one.log"
test -f "$work/one/model_with_epoch2.pt"
echo "resume check passed"

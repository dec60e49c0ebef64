#!/usr/bin/env bash
# Usage: checkpoint_faults.sh CASE MPIEXEC DDP_CIFAR MAKE_CIFAR_DATA STALL_WRITE_LIB BASE
# Faults of the checkpoint directory, on 2 ranks of ddp_cifar (a small synthetic data set, two
# steps an epoch). Every case but `setup` starts from the files of epoch 1 that `setup` wrote
# (BASE/epoch1) and trains epoch 2 with --resume.
#   setup            the data set (BASE/data) and epoch 1's model and snapshot (BASE/epoch1).
#   full-disk        the file system fills up while the epoch-2 model, then (a second run) the
#                    epoch-2 snapshot, is written (a tmpfs sized from epoch 1's files): the job
#                    fails with "No space left on device" naming the file, leaves no temporary
#                    file, and epoch 1's files are unchanged.
#   read-only        a read-only checkpoint directory is refused before any training.
#   metrics-full-disk  --metrics-file on a full file system (issue 26): the job fails at the
#                    epoch's line naming the file and "No space left on device" (it said only
#                    "write failed"), after the epoch's checkpoint is written (issue 38: it ended
#                    before it); with room again, --resume continues from that checkpoint and
#                    the metrics file holds the next epoch's line.
#   kill-mid-write   rank 0 is killed (kill -9) half-way through writing the epoch-2 snapshot
#                    (held there by STALL_WRITE_LIB): the epoch-1 snapshot is unchanged, and
#                    the next run removes the stale temporary file and resumes from epoch 1.
# full-disk, metrics-full-disk and read-only mount a tmpfs, so they need root; they run in a private mount
# namespace (unshare -m), so nothing stays mounted, even if the test dies. Without root, or
# where unshare is not permitted, they are skipped (exit 77).
set -euo pipefail
case_=$1 mpiexec=$2 ddp_cifar=$3 make_data=$4 stall=$5 base=$6
work=$base/$case_

if [[ $case_ == full-disk || $case_ == metrics-full-disk || $case_ == read-only ]] && [ -z "${DDP_FAULTS_IN_NAMESPACE:-}" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: $case_ mounts a tmpfs, which needs root (this is uid $(id -u))"; exit 77
  fi
  if ! unshare -m --propagation private true 2> /dev/null; then
    echo "SKIP: $case_ needs a private mount namespace (unshare -m), not permitted here"; exit 77
  fi
  exec env DDP_FAULTS_IN_NAMESPACE=1 unshare -m --propagation private "$0" "$@"
fi
rm -rf "$work" && mkdir -p "$work"

mpi_extra=()  # mpirun's own options (-x for the stalled write)
train() {
  "$mpiexec" -np 2 "${mpi_extra[@]}" "$ddp_cifar" --data-dir "$base/data" --model cnn \
    --batch-size 32 --limit-train-batches 2 --log-interval 0 --test-batch-size 64 \
    --keep-checkpoints 0 "$@"
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
fail() { echo "FAIL: $*" >&2; exit 1; }
# The temporary files of our writer ("<file>.tmp.<host>.<pid>") in a directory.
temporaries() { find "$1" -maxdepth 1 -name '*.tmp.*' | sort; }
kib() { echo $(( ($(stat -c %s "$1") + 4095) / 4096 * 4 )); }  # tmpfs pages, in KiB
epoch1() { cp "$base/epoch1/model_with_epoch1.pt" "$base/epoch1/snapshot_epoch1.pt" "$1"; }
unchanged() {
  for f in model_with_epoch1.pt snapshot_epoch1.pt; do
    cmp "$base/epoch1/$f" "$1/$f" || fail "$1/$f changed"
  done
}

# Runs train "$@" expecting failure; output in $work/$name.log.
expect_failure() {
  local name=$1; shift
  local start=$(now_ms) status=0
  train "$@" > "$work/$name.log" 2>&1 || status=$?
  grep -v '^$' "$work/$name.log" | tail -n 4
  [ "$status" -ne 0 ] || fail "$name: the job exited 0"
  echo "$name: exit status $status after $(( $(now_ms) - start )) ms"
}

case $case_ in
setup)
  rm -rf "$base/data" "$base/epoch1"
  "$make_data" "$base/data" --train 256 --test 64
  train --epochs 1 --checkpoint-dir "$base/epoch1" | tail -n 3
  ;;
full-disk)
  model=$(kib "$base/epoch1/model_with_epoch1.pt") snapshot=$(kib "$base/epoch1/snapshot_epoch1.pt")
  echo "epoch 1: model ${model} KiB, snapshot ${snapshot} KiB"
  for what in model snapshot; do
    # Room for epoch 1's files and half of the epoch-2 file that must fail.
    if [ $what = model ]; then room=$(( model + snapshot + model / 2 )); file=model_with_epoch2.pt
    else room=$(( 2 * model + snapshot + snapshot / 2 )); file=snapshot_epoch2.pt; fi
    disk=$work/disk_$what
    mkdir -p "$disk" && mount -t tmpfs -o size=${room}k tmpfs "$disk"
    epoch1 "$disk"
    echo "== a ${room} KiB tmpfs: epoch 2's $what does not fit"
    expect_failure "full_$what" --epochs 2 --checkpoint-dir "$disk" --resume
    grep -Eq "ddp: rank 0 \(.*\): $disk/$file: cannot write $disk/$file\.tmp\.[^ ]+: No space left on device" \
      "$work/full_$what.log" || fail "no 'No space left on device' naming $disk/$file"
    ! grep -q "unexpected pos\|terminate called" "$work/full_$what.log" || fail "LibTorch aborted"
    echo "files left: $(ls -A "$disk" | tr '\n' ' ')"
    [ -z "$(temporaries "$disk")" ] || fail "temporary files left: $(temporaries "$disk")"
    [ ! -e "$disk/$file" ] || fail "$disk/$file exists"
    unchanged "$disk"
    umount "$disk"
  done
  ;;
metrics-full-disk)
  disk=$work/metrics_disk
  mkdir -p "$disk" && mount -t tmpfs -o size=4k tmpfs "$disk"
  head -c 4096 /dev/zero > "$disk/filler" 2> /dev/null || true  # every page of the tmpfs
  expect_failure metrics_full --epochs 2 --metrics-file "$disk/metrics.jsonl" --checkpoint-dir "$work/checkpoints"
  grep -q "ddp: rank 0 (.*): $disk/metrics.jsonl: cannot write the metrics file: No space left on device" \
    "$work/metrics_full.log" || fail "the message does not name the metrics file and the reason"
  grep -q "Train set:\|Test set:" "$work/metrics_full.log" || fail "it failed before the epoch's end"
  test -s "$work/checkpoints/snapshot_epoch1.pt" || fail "the failed metrics write cost epoch 1's snapshot"
  [ ! -e "$work/checkpoints/snapshot_epoch2.pt" ] || fail "the job went on after the failed write"
  rm "$disk/filler"
  train --epochs 2 --metrics-file "$disk/metrics.jsonl" --checkpoint-dir "$work/checkpoints" --resume \
    > "$work/metrics_resumed.log" 2>&1 || fail "the resumed run failed: $(tail -n 3 "$work/metrics_resumed.log")"
  grep -q "Resumed from $work/checkpoints/snapshot_epoch1.pt: epoch 1 done" "$work/metrics_resumed.log" ||
    fail "the resumed run did not continue from epoch 1's snapshot"
  grep -q '^{"epoch":2,' "$disk/metrics.jsonl" && [ "$(wc -l < "$disk/metrics.jsonl")" -eq 1 ] ||
    fail "the metrics file should hold epoch 2's line only: $(cat "$disk/metrics.jsonl")"
  umount "$disk"
  ;;
read-only)
  disk=$work/read_only
  mkdir -p "$disk" && mount -t tmpfs -o size=64m tmpfs "$disk"
  epoch1 "$disk"
  mount -o remount,ro "$disk"
  expect_failure read_only --epochs 2 --checkpoint-dir "$disk" --resume
  grep -q "ddp: rank 0 (.*): CheckpointerOptions::dir: $disk: the checkpoint directory is not writable (cannot create a file in it): Read-only file system" \
    "$work/read_only.log" || fail "the message does not name the directory and the reason"
  ! grep -q "Resumed from\|Test set: Average" "$work/read_only.log" || fail "it went on before reporting"
  unchanged "$disk"
  umount "$disk"
  ;;
kill-mid-write)
  dir=$work/checkpoints
  mkdir -p "$dir" && epoch1 "$dir"
  echo "== epoch 2, rank 0 killed half-way through writing its snapshot"
  marker=$work/stalled
  mpi_extra=(-x LD_PRELOAD="$stall" -x DDP_STALL_WRITE_TO=snapshot_epoch2.pt.tmp.
             -x DDP_STALL_MARKER="$marker")
  train --epochs 2 --checkpoint-dir "$dir" --resume > "$work/killed.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do [ -s "$marker" ] && break; sleep 0.1; done
  [ -s "$marker" ] || { kill -9 $job; fail "the snapshot write never started (60 s)"; }
  start=$(now_ms)
  kill -9 "$(cat "$marker")"
  status=0; wait $job || status=$?
  echo "job ended with status $status, $(( $(now_ms) - start )) ms after the kill"
  [ "$status" -ne 0 ] || fail "the job exited 0"
  unchanged "$dir"
  [ ! -e "$dir/snapshot_epoch2.pt" ] || fail "a snapshot_epoch2.pt exists"
  stale=$(temporaries "$dir")
  [ -n "$stale" ] || fail "no partial temporary file: was the write really interrupted?"
  echo "left by the kill: $stale ($(stat -c %s "$stale") of $(stat -c %s "$base/epoch1/snapshot_epoch1.pt") bytes)"
  echo "== the next run removes it and resumes from epoch 1"
  mpi_extra=()
  train --epochs 2 --checkpoint-dir "$dir" --resume > "$work/next.log" 2>&1
  grep -q "Removed $stale, left by an interrupted write of an earlier run" "$work/next.log" ||
    fail "the stale temporary file was not reported removed"
  grep -q "Resumed from $dir/snapshot_epoch1.pt: epoch 1 done" "$work/next.log" || fail "no resume"
  [ -z "$(temporaries "$dir")" ] || fail "temporary files left: $(temporaries "$dir")"
  test -s "$dir/snapshot_epoch2.pt"
  ;;
*) fail "unknown case $case_" ;;
esac
echo "checkpoint_faults $case_: passed"

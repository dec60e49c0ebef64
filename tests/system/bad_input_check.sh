#!/usr/bin/env bash
# Every bad input of issue 16 ends the example programs with a non-zero status, a message that
# names the flag or the file, and neither an abort (SIGABRT) nor an exit on another signal.
# Prints the time each takes to fail (docs/reliability.md).
# Usage: bad_input_check.sh MPIEXEC DDP_MNIST DDP_CIFAR MAKE_CIFAR_DATA TMPDIR
set -u
mpiexec=$1 mnist=$2 cifar=$3 make_cifar=$4 tmp=$5
rm -rf "$tmp" && mkdir -p "$tmp"

# Small MNIST-format data sets: good (4 train, 2 test images), empty ones, and broken ones.
python3 - "$tmp" <<'PY'
import os, struct, sys
tmp = sys.argv[1]
def idx(dims, data=None):
    n = 1
    for d in dims: n *= d
    head = bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    return head + (bytes(i % 10 for i in range(n)) if data is None else data)
def dataset(name, train_n, test_n, train_images=None):
    d = os.path.join(tmp, name); os.makedirs(d)
    open(f"{d}/train-images-idx3-ubyte", "wb").write(train_images or idx([train_n, 28, 28]))
    open(f"{d}/train-labels-idx1-ubyte", "wb").write(idx([train_n]))
    open(f"{d}/t10k-images-idx3-ubyte", "wb").write(idx([test_n, 28, 28]))
    open(f"{d}/t10k-labels-idx1-ubyte", "wb").write(idx([test_n]))
dataset("good", 4, 2)
dataset("empty_train", 0, 2)
dataset("empty_test", 4, 0)
dataset("absurd", 4, 2, train_images=idx([60000, 512, 512], bytes(29)))  # the issue's 45 bytes
dataset("directory", 4, 2)
os.remove(f"{tmp}/directory/train-images-idx3-ubyte")
os.makedirs(f"{tmp}/directory/train-images-idx3-ubyte")
dataset("fifo", 4, 2)
os.remove(f"{tmp}/fifo/train-images-idx3-ubyte")
os.mkfifo(f"{tmp}/fifo/train-images-idx3-ubyte")  # no writer: an open() for reading would wait
# A snapshot of a format newer than this build's (issue 38): "DDPSNAP4", a size and a hash.
open(f"{tmp}/newer_format.pt", "wb").write(b"DDPSNAP4" + struct.pack("<QQ", 64, 0) + bytes(64))
PY

# A CIFAR-format set of CIFAR-10's size (random pixels), for the memory check.
cifar_data=$tmp/cifar
"$make_cifar" "$cifar_data" --train 50000 --test 16 > /dev/null || exit 1

failures=0
# says NAME REGEX COMMAND...: status 0 and a line of the output matches REGEX (issue 38: what is
# not an error must still be said).
says() {
  local name=$1 regex=$2
  shift 2
  local output status verdict=ok
  output=$("$@" 2>&1)
  status=$?
  if [ "$status" -ne 0 ]; then
    verdict="FAIL: exit status $status"
  elif ! printf '%s\n' "$output" | grep -Eq -- "$regex"; then
    verdict="FAIL: the output does not match: $regex"
  fi
  printf '%-28s status %3d  %s\n' "$name" "$status" "$verdict"
  if [ "$verdict" != ok ]; then
    printf '%s\n' "$output" | tail -n 15 | sed 's/^/    | /'
    failures=$((failures + 1))
  fi
}

# check NAME REGEX COMMAND...: non-zero, not a signal, the output matches REGEX; with
# want_status=N set for the call, the status must be N.
check() {
  local name=$1 regex=$2
  shift 2
  local start end output status
  start=$(date +%s%N)
  output=$("$@" 2>&1)
  status=$?
  end=$(date +%s%N)
  local ms=$(( (end - start) / 1000000 ))
  local verdict=ok
  if [ "$status" -eq 0 ]; then
    verdict="FAIL: exit status 0"
  elif [ -n "${want_status:-}" ] && [ "$status" -ne "$want_status" ]; then
    verdict="FAIL: exit status $status, not $want_status"
  elif [ "$status" -gt 128 ] || printf '%s' "$output" | grep -Eq 'signal 6|SIGABRT|Aborted|core dumped|terminate called'; then
    verdict="FAIL: exit status $status, killed or aborted"
  elif ! printf '%s\n' "$output" | grep -Eq -- "$regex"; then
    verdict="FAIL: exit status $status, the output does not match: $regex"
  fi
  printf '%-28s status %3d  %6d ms  %s\n' "$name" "$status" "$ms" "$verdict"
  if [ "$verdict" != ok ]; then
    printf '%s\n' "$output" | tail -n 15 | sed 's/^/    | /'
    failures=$((failures + 1))
  fi
}

# Most cases run as a singleton (no launcher: the checks are the same under every launcher and
# a start is faster); two run on 2 ranks under mpirun, where every rank must stop. Every flag's
# check has its unit test (example_flag_tests); here, the issue's cases end to end.
on2() { "$mpiexec" -np 2 "$@"; }
data=(--data-dir "$tmp/good" --no-cuda)

check epochs_0 '--epochs must be >= 1 \(got 0\)' "$mnist" "${data[@]}" --epochs 0
check epochs_negative '--epochs must be >= 1 \(got -2\)' "$mnist" "${data[@]}" --epochs -2
check lr_nan '--lr must be a finite number > 0 \(got nan\)' "$mnist" "${data[@]}" --lr nan
check lr_beyond_float '--lr must be at most 3.40282e\+38, the largest float the optimizer holds \(got 1e\+39\)' "$mnist" "${data[@]}" --lr 1e39
check clip_beyond_float '--clip-grad-norm must be at most 3.40282e\+38' "$mnist" "${data[@]}" --clip-grad-norm 1e39
check on_nonfinite_unknown "--on-nonfinite: 'ignore' is not one of: stop, skip" "$mnist" "${data[@]}" --on-nonfinite ignore
check gamma_nan '--gamma must be a finite number >= 0 \(got nan\)' "$mnist" "${data[@]}" --gamma nan
check log_interval_negative '--log-interval must be >= 0 \(got -1\)' "$mnist" "${data[@]}" --log-interval -1
check resume_fallback_alone '--resume-fallback needs --resume' "$mnist" "${data[@]}" --resume-fallback
check cifar_momentum_nan '--momentum must be a finite number >= 0 \(got nan\)' "$cifar" --no-cuda --momentum nan
check empty_train_set "empty_train/train-images-idx3-ubyte: no images: the data set is empty" \
  on2 "$mnist" --no-cuda --data-dir "$tmp/empty_train"
check empty_test_set "empty_test/t10k-images-idx3-ubyte: no images: the data set is empty" \
  "$mnist" --no-cuda --data-dir "$tmp/empty_test"
check idx_absurd_header "absurd/train-images-idx3-ubyte: truncated: the header promises 15728640000 bytes" \
  "$mnist" --no-cuda --data-dir "$tmp/absurd"
check idx_is_a_directory "directory/train-images-idx3-ubyte: not a regular file: it is a directory" \
  "$mnist" --no-cuda --data-dir "$tmp/directory"
check idx_is_a_fifo "fifo/train-images-idx3-ubyte: not a regular file" \
  timeout 60 "$mnist" --no-cuda --data-dir "$tmp/fifo"
check checkpoint_dir_empty '--checkpoint-dir must name a folder \(got an empty string\)' \
  "$mnist" --no-cuda --checkpoint-dir ""
# Issue 25: snapshots every S seconds need S finite and > 0, and a folder (a usage error: status 2).
want_status=2 check checkpoint_seconds_0 '--checkpoint-every-seconds must be a finite number > 0 \(got 0\)' \
  "$mnist" "${data[@]}" --checkpoint-dir "$tmp/ck" --checkpoint-every-seconds 0
want_status=2 check checkpoint_seconds_negative '--checkpoint-every-seconds must be a finite number > 0 \(got -1\)' \
  "$mnist" "${data[@]}" --checkpoint-dir "$tmp/ck" --checkpoint-every-seconds -1
want_status=2 check checkpoint_seconds_nan '--checkpoint-every-seconds must be a finite number > 0 \(got nan\)' \
  "$mnist" "${data[@]}" --checkpoint-dir "$tmp/ck" --checkpoint-every-seconds nan
want_status=2 check checkpoint_seconds_no_dir '--checkpoint-every-seconds needs --checkpoint-dir to write to' \
  "$mnist" "${data[@]}" --checkpoint-every-seconds 60
check resume_from_directory "$tmp: cannot read the snapshot: not a regular file: it is a directory" \
  "$mnist" "${data[@]}" --resume="$tmp"
# Issue 38, said, not silent. --resume on a mistyped folder (created, empty) or on one without a
# snapshot: one line naming it, at 2 ranks as the issue ran it; training goes on from scratch.
says resume_mistyped_folder "^No snapshot in $tmp/typo: the folder did not exist \(created now\); training starts from scratch at epoch 1\$" \
  on2 "$mnist" "${data[@]}" --epochs 1 --log-interval 0 --checkpoint-dir "$tmp/typo" --resume
mkdir -p "$tmp/empty_folder"
says resume_empty_folder "^No snapshot in $tmp/empty_folder: the folder is empty; training starts from scratch at epoch 1\$" \
  "$mnist" "${data[@]}" --epochs 1 --log-interval 0 --checkpoint-dir "$tmp/empty_folder" --resume
mkdir -p "$tmp/no_snapshot" && echo notes > "$tmp/no_snapshot/notes.txt"
says resume_folder_no_snapshot "^No snapshot in $tmp/no_snapshot: none of its 1 file\(s\) is a snapshot_epoch\*\.pt; training starts from scratch at epoch 1\$" \
  "$mnist" "${data[@]}" --epochs 1 --log-interval 0 --checkpoint-dir "$tmp/no_snapshot" --resume
# A snapshot of a newer ddp names its format and this build's (it was "not a ddp training snapshot").
check snapshot_newer_format "$tmp/newer_format.pt: a snapshot of format 4 \(DDPSNAP4\), written by a newer ddp; this build reads format 3 \(DDPSNAP3\)" \
  "$mnist" "${data[@]}" --resume="$tmp/newer_format.pt"
# An unwritable --metrics-file is refused with the reason.
check metrics_file_unwritable "$tmp/no/such/folder/metrics.jsonl: cannot open the metrics file for writing: No such file or directory" \
  "$mnist" "${data[@]}" --metrics-file "$tmp/no/such/folder/metrics.jsonl"
# A metrics write that fails (/dev/full: ENOSPC, as a full disk) ends the job after the epoch's
# checkpoint, not before it.
check metrics_write_fails "/dev/full: cannot write the metrics file: No space left on device \(after epoch 1's snapshot $tmp/metrics_ck/snapshot_epoch1.pt was written" \
  "$mnist" "${data[@]}" --epochs 2 --metrics-file /dev/full --checkpoint-dir "$tmp/metrics_ck"
if [ ! -s "$tmp/metrics_ck/snapshot_epoch1.pt" ] || [ ! -s "$tmp/metrics_ck/model_with_epoch1.pt" ] ||
   [ -e "$tmp/metrics_ck/snapshot_epoch2.pt" ]; then
  echo "metrics_write_fails: FAIL: epoch 1's checkpoint (and nothing later) should be there: $(ls "$tmp/metrics_ck" 2>&1 | tr '\n' ' ')"
  failures=$((failures + 1))
fi
# Ranks started with different flags (mpirun's MPMD syntax: one command line per rank), or a bad
# flag on one rank only: refused with status 2 before training, naming the flag and the ranks
# (issue 26: before, Open MPI's MPI_ERR_TRUNCATE in the first step, status 15; a hang).
want_status=2 check flags_differ_between_ranks \
  'ddp_mnist: the ranks were started with different flags: --limit-train-batches is 3 on rank 0 and 5 on rank 1' \
  timeout 60 "$mpiexec" -np 1 "$mnist" "${data[@]}" --limit-train-batches 3 : -np 1 "$mnist" "${data[@]}" --limit-train-batches 5
want_status=2 check bad_flag_on_one_rank \
  'ddp_mnist: the ranks were started with different flags, refused on rank 1: --epochs must be >= 1 \(got 0\) \(see --help\)' \
  timeout 60 "$mpiexec" -np 1 "$mnist" "${data[@]}" : -np 1 "$mnist" "${data[@]}" --epochs 0
want_status=2 check programs_differ_between_ranks \
  'the ranks run different programs: ddp_mnist on rank 0 and ddp_cifar on rank 1' \
  timeout 60 "$mpiexec" -np 1 "$mnist" --no-cuda : -np 1 "$cifar" --no-cuda
# ResNet-18 keeps about 10 MB per CIFAR sample for backward: a batch of a rank's whole shard of
# the synthetic training set (25000 of 50000) needs some 250 GB per rank, more than any machine
# this runs on has.
check batch_size_huge '--batch-size 1000000000 \(25000 samples per batch on each rank\) cannot fit in memory: a training step needs at least .* is available' \
  on2 "$cifar" --no-cuda --data-dir "$cifar_data" --model resnet18 --batch-size 1000000000

if [ "$failures" -ne 0 ]; then
  echo "bad_input_check: $failures case(s) failed" >&2
  exit 1
fi
echo "bad_input_check: every bad input failed cleanly, naming the flag or file"

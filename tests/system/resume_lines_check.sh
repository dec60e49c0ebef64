#!/usr/bin/env bash
# The lines of a resume say only what is true (issue 60), with real jobs of ddp_mnist on a small
# copy of Fashion-MNIST (512 training images):
#   1. a finished 2-rank run resumed with nothing left to train: status 0 and a line naming the
#      snapshot and the epochs;
#   2. that 2-rank snapshot (the allreduce hook) resumed on 1 rank: no comm-hook warning (no hook
#      at one rank is the same arithmetic as allreduce), the world size's warning only; a 2-rank
#      PowerSGD snapshot resumed on 1 rank still warns (its compression is not used there);
#   3. SIGTERM on rank 1 after the run's last step: status 0 (the run is complete) and a line
#      saying so, naming the snapshot;
#   4. a 2-rank snapshot after step 3 (96 of 512 samples) resumed on 3 ranks: the rest, 416, is
#      shared as 139 per rank, 1 position of padding, and rank 0 says so; the sample logs of the
#      two runs show every sample trained, exactly one twice;
#   5. the same snapshot resumed with another --batch-size: the progress counter counts the
#      epoch's samples (96 before the rest, then 64 per batch on 2 ranks), never past 512.
#
#   resume_lines_check.sh MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP WORKDIR
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP WORKDIR" >&2; exit 2; }
mpiexec=$1 ddp_mnist=$2 signal_at_step=$3 work=$4
rm -rf "$work" && mkdir -p "$work/data"
data=$work/data
/usr/bin/python3 "$(dirname "$0")/mnist_subset.py" "${DDP_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" "$data" 512 64

common=(--data-dir "$data" --seed 5 --test-batch-size 64 --keep-checkpoints 0)
base=("${common[@]}" --log-interval 0)
flags=("${base[@]}" --epochs 1)
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line of $1 matches: $2"; }; }
refuse() { if grep -Eq -- "$2" "$1"; then cat "$1"; fail "a line of $1 matches: $2"; fi; }
# run NAME STATUS NP PROGRAM FLAGS...: a job of NP ranks, its log in $work/NAME.log, its exit
# status STATUS.
run() {
  local name=$1 want=$2 np=$3 status=0
  shift 3
  echo "+ mpirun -np $np $*"
  "$mpiexec" -np "$np" "$@" > "$work/$name.log" 2>&1 || status=$?
  [ $status -eq "$want" ] || { cat "$work/$name.log"; fail "$name: exit status $status, expected $want"; }
}

echo "== 1. a finished run resumed: nothing left to train, status 0"
run done 0 2 "$ddp_mnist" "${flags[@]}" --batch-size 32 --checkpoint-dir "$work/done"
cp -r "$work/done" "$work/done_copy"
run nothing_left 0 2 "$ddp_mnist" "${flags[@]}" --batch-size 32 --checkpoint-dir "$work/done" --resume
expect "$work/nothing_left.log" "^Nothing left to train: $work/done/snapshot_epoch1.pt is the end of epoch 1 \(step 8\), and this run ends at epoch 1: the run is complete; give more epochs to train on$"
grep "^Nothing left" "$work/nothing_left.log"

echo "== 2. 2 ranks -> 1: allreduce and no hook are the same arithmetic; PowerSGD is not"
run one_rank 0 1 "$ddp_mnist" "${base[@]}" --epochs 2 --limit-train-batches 2 --batch-size 32 \
  --checkpoint-dir "$work/done_copy" --resume
expect "$work/one_rank.log" "^Warning: the snapshot was written by 2 rank\(s\), this run has 1: "
refuse "$work/one_rank.log" "^Warning: the comm hook"
powersgd=(--comm-hook powersgd --powersgd-start-iter 2 --batch-size 32)
run powersgd 0 2 "$ddp_mnist" "${flags[@]}" "${powersgd[@]}" --limit-train-batches 3 --checkpoint-dir "$work/powersgd"
run powersgd_one_rank 0 1 "$ddp_mnist" "${base[@]}" "${powersgd[@]}" --epochs 2 --limit-train-batches 1 \
  --checkpoint-dir "$work/powersgd" --resume
expect "$work/powersgd_one_rank.log" "^Warning: the comm hook is none, the snapshot's run had powersgd\(matrix_approximation_rank=1, start_powerSGD_iter=2, .*: the run goes on, but no longer on the trajectory"

echo "== 3. SIGTERM after the run's last step: the run is complete, status 0"
run late 0 2 "$signal_at_step" --signal-at-step=8:1:TERM "${flags[@]}" --batch-size 32 --checkpoint-dir "$work/late"
expect "$work/late.log" "^SIGTERM \(rank 1\) came after the run's last step: the run is complete \(saved $work/late/snapshot_epoch1.pt\); nothing is left to resume$"
grep "^SIGTERM" "$work/late.log"

echo "== 4. 2 ranks -> 3 inside the epoch: the padding is said, and is what trains"
mkdir -p "$work/stopped.samples" "$work/three.samples"
# The test build's sample log (DDP_TEST_SAMPLE_LOG): "<epoch> <step> <index>" per sample trained.
export DDP_TEST_SAMPLE_LOG="$work/stopped.samples"
run stopped 75 2 -x DDP_TEST_SAMPLE_LOG "$signal_at_step" --signal-at-step=2:0:TERM "${flags[@]}" \
  --batch-size 16 --checkpoint-dir "$work/stopped"
[ -f "$work/stopped/snapshot_epoch1_batch3.pt" ] || { ls "$work/stopped"; fail "no snapshot after step 3"; }
cp -r "$work/stopped" "$work/rebatched"
export DDP_TEST_SAMPLE_LOG="$work/three.samples"
run three 0 3 -x DDP_TEST_SAMPLE_LOG "$signal_at_step" "${flags[@]}" --batch-size 16 \
  --checkpoint-dir "$work/stopped" --resume
unset DDP_TEST_SAMPLE_LOG
expect "$work/three.log" "^The rest of epoch 1, 416 samples from position 96 of its order, is shared over 3 ranks as 139 each: 1 position\(s\) repeat samples of the rest, as DistributedSampler pads an epoch that does not divide among the ranks \(as PyTorch's\)$"
grep "^The rest of epoch" "$work/three.log"
/usr/bin/python3 - 512 "$work/stopped.samples" "$work/three.samples" <<'PY'
import collections, glob, sys
size, dirs = int(sys.argv[1]), sys.argv[2:]
count = collections.Counter()
for d in dirs:
    for path in glob.glob(f"{d}/rank*.txt"):
        for line in open(path):
            epoch, step, index = map(int, line.split())
            count[index] += 1
missing = [i for i in range(size) if i not in count]
twice = [i for i, c in count.items() if c == 2]
other = {i: c for i, c in count.items() if c > 2 or not 0 <= i < size}
if missing or other or len(twice) != 1:
    sys.exit(f"FAIL: {len(missing)} samples missing, {len(twice)} trained twice, {other} otherwise")
print(f"  every one of the {size} samples trained, one of them twice ({twice[0]}): "
      f"{sum(count.values())} in all")
PY

echo "== 5. another --batch-size: the progress counter counts the epoch's samples"
run rebatched 0 2 "$ddp_mnist" "${common[@]}" --epochs 1 --batch-size 32 --progress log --log-interval 1 \
  --checkpoint-dir "$work/rebatched" --resume
expect "$work/rebatched.log" "^Warning: the per-rank batch size is 32, the snapshot's run had 16: "
# 96 samples before the rest, then 7 batches of 32 on each of 2 ranks (the last one short).
# (ddp_mnist's lines are the classification preset's, PyTorch's mnist.py's.)
expect "$work/rebatched.log" "^Train Epoch: 1 \[96/512 \(19%\)\]"
expect "$work/rebatched.log" "^Train Epoch: 1 \[480/512 \(88%\)\]"
[ "$(grep -c '^Train Epoch: 1 \[' "$work/rebatched.log")" -eq 7 ] || { cat "$work/rebatched.log"; fail "not 7 progress lines"; }
refuse "$work/rebatched.log" "^Train Epoch: 1 \[(5[1-9][0-9]|[6-9][0-9][0-9]|[0-9]{4,})/512"
grep "^Train Epoch: 1 \[" "$work/rebatched.log"
echo "PASS: the resume's lines say what happens"

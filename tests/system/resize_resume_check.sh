#!/usr/bin/env bash
# Resuming a snapshot taken inside an epoch at another world size (issue 25), with real jobs of
# ddp_mnist on a small copy of Fashion-MNIST (768 training images), the CNN without dropout
# (--no-dropout: dropout draws per rank, so runs over other rank counts could not train the same
# model with it):
#   1. 4 ranks x 16, 2 epochs of 4 steps, stopped after step 3 (a SIGTERM:
#      snapshot_epoch1_batch3.pt), resumed on 2 ranks with --keep-global-batch (2 x 32): every
#      step trains the same samples as in 4 x 16 throughout (the sample logs, DDP_TEST_SAMPLE_LOG)
#      and the final model equals that run's within 1e-5 (the same sums in another order);
#   2. the same growing: 2 ranks x 32 stopped after step 3, resumed on 4 with --keep-global-batch,
#      against 2 x 32 throughout;
#   3. 4 x 16, a whole epoch (12 steps), stopped after step 3 and resumed on 2 ranks without
#      --keep-global-batch (2 x 16: the global batch halves): every sample of the epoch is
#      trained exactly once over the two runs; the model differs from 4 x 16's (the comparison
#      can fail);
#   4. --keep-global-batch where the global batch does not divide (64 over 3 ranks): status 2,
#      the message names the flag and the numbers.
# Why so few steps: runs that reduce in another order (2 x 32 against 4 x 16) differ in the last
# bits, and Adadelta at lr 1 amplifies that step by step (4 x 16 against 2 x 32 throughout: 3e-8
# after 1 step, 2e-7 after 3, 8e-5 after 6, 5e-3 after 24). The resumed runs share the first steps
# bit for bit, so they stay closer. The max abs differences are printed.
#
#   resize_resume_check.sh MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP DDP_COMPARE_MODELS WORKDIR
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP DDP_COMPARE_MODELS WORKDIR" >&2; exit 2; }
mpiexec=$1 ddp_mnist=$2 signal_at_step=$3 compare=$4 work=$5
tolerance=1e-5
rm -rf "$work" && mkdir -p "$work"

data=$work/data
mkdir -p "$data"
/usr/bin/python3 "$(dirname "$0")/mnist_subset.py" "${DDP_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" "$data" 768 256

base=(--data-dir "$data" --seed 5 --no-dropout --log-interval 0 --test-batch-size 256 --keep-checkpoints 0)
flags=("${base[@]}" --epochs 2 --limit-train-batches 4)
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line of $1 matches: $2"; }; }
# train NAME DIR NP BATCH [FLAGS...]: a run to its end with checkpoints in $work/DIR, its log in
# $work/NAME.log, its sample logs in $work/NAME.samples (DDP_TEST_SAMPLE_LOG: the test build,
# ddp_mnist_signal_at_step without --signal-at-step, is ddp_mnist with the sample log).
train() {
  local name=$1 dir=$2 np=$3 batch=$4
  shift 4
  echo "+ mpirun -np $np ddp_mnist_signal_at_step ${flags[*]} --batch-size $batch $*"
  mkdir -p "$work/$name.samples"
  local status=0
  DDP_TEST_SAMPLE_LOG="$work/$name.samples" "$mpiexec" -np "$np" -x DDP_TEST_SAMPLE_LOG "$signal_at_step" \
    "${flags[@]}" --batch-size "$batch" --checkpoint-dir "$work/$dir" "$@" > "$work/$name.log" 2>&1 ||
    status=$?
  [ $status -eq 0 ] || { cat "$work/$name.log"; fail "$name: exit status $status"; }
}
# stopped NAME NP BATCH: the same run, stopped after step 3 by a SIGTERM on rank 0 after step 2
# (agreed a boundary later; status 75).
stopped() {
  local name=$1 np=$2 batch=$3 status=0
  echo "+ mpirun -np $np ddp_mnist_signal_at_step --signal-at-step=2:0:TERM ${flags[*]} --batch-size $batch"
  mkdir -p "$work/$name.samples"
  DDP_TEST_SAMPLE_LOG="$work/$name.samples" "$mpiexec" -np "$np" -x DDP_TEST_SAMPLE_LOG "$signal_at_step" \
    --signal-at-step=2:0:TERM "${flags[@]}" --batch-size "$batch" --checkpoint-dir "$work/$name" \
    > "$work/$name.log" 2>&1 || status=$?
  [ $status -eq 75 ] || { cat "$work/$name.log"; fail "$name: exit status $status, expected 75"; }
  [ -f "$work/$name/snapshot_epoch1_batch3.pt" ] || { ls "$work/$name"; fail "$name: no snapshot after step 3"; }
}
# every_sample_once SAMPLE_DIR...: over the rank files of the directories, epoch 1's indices are
# 0..767, each exactly once; prints how many each directory trained.
every_sample_once() {
  /usr/bin/python3 - 768 "$@" <<'PY'
import collections, glob, sys
size, dirs = int(sys.argv[1]), sys.argv[2:]
count = collections.Counter()
for d in dirs:
    n = 0
    for path in glob.glob(f"{d}/rank*.txt"):
        for line in open(path):
            epoch, step, index = map(int, line.split())
            if epoch == 1:
                count[index] += 1
                n += 1
    print(f"  {d}: {n} samples of epoch 1")
bad = {i: c for i, c in count.items() if c != 1 or not 0 <= i < size}
missing = [i for i in range(size) if i not in count]
if bad or missing:
    sys.exit(f"FAIL: epoch 1 not every sample once: {len(missing)} missing, "
             f"{len(bad)} wrong (e.g. {list(bad.items())[:5]})")
print(f"  every one of the {size} samples of epoch 1 trained exactly once")
PY
}
# same_steps REFERENCE_DIR DIR...: every step (epoch, step) trained the same set of samples in the
# runs of the directories together as in the reference run, each sample once per step.
same_steps() {
  /usr/bin/python3 - "$@" <<'PY'
import collections, glob, sys
def steps(dirs):
    out = collections.defaultdict(collections.Counter)
    for d in dirs:
        for path in glob.glob(f"{d}/rank*.txt"):
            for line in open(path):
                epoch, step, index = map(int, line.split())
                out[(epoch, step)][index] += 1
    return out
reference, resumed = steps(sys.argv[1:2]), steps(sys.argv[2:])
if reference != resumed:
    bad = sorted(k for k in set(reference) | set(resumed) if reference.get(k) != resumed.get(k))
    sys.exit(f"FAIL: steps {bad[:5]} trained other samples than in {sys.argv[1]}")
print(f"  the same samples at each of the {len(reference)} steps as {sys.argv[1]}")
PY
}
# close A B: the models equal within the tolerance; prints and keeps the max abs difference.
close() {
  "$compare" --tolerance "$tolerance" "$1" "$2" | tee "$work/compare.txt" || fail "models differ beyond $tolerance"
}

echo "== the references: 4 x 16 and 2 x 32 throughout"
train four four 4 16
train two two 2 32

echo "== 1. 4 x 16 for 3 steps, then 2 ranks with --keep-global-batch"
stopped shrink 4 16
cp "$work/shrink/snapshot_epoch1_batch3.pt" "$work/at_step3_on_4_ranks.pt"  # for case 4
train shrink.resumed shrink 2 16 --resume --keep-global-batch
log=$work/shrink.resumed.log
expect "$log" "^Resumed from $work/shrink/snapshot_epoch1_batch3.pt: epoch 0 done, 3 batches of epoch 1, step 3$"
expect "$log" "^Warning: the snapshot was written by 4 rank\(s\), this run has 2: the rest of epoch 1 \(from sample 192 of its order\) is re-sharded over the 2 ranks; each rank's random generators and epoch metrics so far are not restored \(they are per rank\), so epoch 1's metrics cover only its rest$"
expect "$log" "^Keeping the snapshot's global batch of 64 \(16 per rank x 4 ranks\): 32 per rank on 2 ranks"
same_steps "$work/four.samples" "$work/shrink.samples" "$work/shrink.resumed.samples"
close "$work/four/model_with_epoch2.pt" "$work/shrink/model_with_epoch2.pt"
shrink_diff=$(cat "$work/compare.txt")

echo "== 2. 2 x 32 for 3 steps, then 4 ranks with --keep-global-batch"
stopped grow 2 32
train grow.resumed grow 4 32 --resume --keep-global-batch
expect "$work/grow.resumed.log" "^Keeping the snapshot's global batch of 64 \(32 per rank x 2 ranks\): 16 per rank on 4 ranks"
same_steps "$work/two.samples" "$work/grow.samples" "$work/grow.resumed.samples"
close "$work/two/model_with_epoch2.pt" "$work/grow/model_with_epoch2.pt"
grow_diff=$(cat "$work/compare.txt")

echo "== 3. 4 x 16, a whole epoch: 3 steps, then 2 x 16 (no --keep-global-batch)"
flags=("${base[@]}" --epochs 1)
stopped half 4 16
train half.resumed half 2 16 --resume
expect "$work/half.resumed.log" "^Resumed from $work/half/snapshot_epoch1_batch3.pt: epoch 0 done, 3 batches of epoch 1, step 3$"
every_sample_once "$work/half.samples" "$work/half.resumed.samples"
# 3 steps of 64 on 4 ranks, then (768 - 192) / 32 = 18 steps of 32 on 2: steps 4 to 21.
/usr/bin/python3 - "$work/half.samples" "$work/half.resumed.samples" <<'PY'
import glob, sys
for d, ranks, steps in ((sys.argv[1], 4, range(1, 4)), (sys.argv[2], 2, range(4, 22))):
    files = sorted(glob.glob(f"{d}/rank*.txt"))
    assert len(files) == ranks, f"{d}: {len(files)} rank files, expected {ranks}"
    seen = {int(l.split()[1]) for f in files for l in open(f)}
    assert seen == set(steps), f"{d}: steps {sorted(seen)}, expected {list(steps)}"
print("  steps 1-3 on 4 ranks, 4-21 on 2")
PY
train four_whole four_whole 4 16
if "$compare" --tolerance "$tolerance" "$work/four_whole/model_with_epoch1.pt" "$work/half/model_with_epoch1.pt" > "$work/differ.txt"; then
  cat "$work/differ.txt"
  fail "a run on other global batches equals 4 x 16 within $tolerance: the comparison cannot fail"
fi

echo "== 4. --keep-global-batch where 64 does not divide among 3 ranks"
status=0
"$mpiexec" -np 3 "$ddp_mnist" "${base[@]}" --epochs 2 --batch-size 16 --resume="$work/at_step3_on_4_ranks.pt" \
  --keep-global-batch > "$work/odd-resumed.log" 2>&1 || status=$?
[ $status -eq 2 ] || { cat "$work/odd-resumed.log"; fail "exit status $status, expected 2"; }
expect "$work/odd-resumed.log" "^--keep-global-batch: the snapshot's global batch of 64 \(16 per rank x 4 ranks\) does not divide among 3 ranks"

echo "4 -> 2 ranks: $shrink_diff"
echo "2 -> 4 ranks: $grow_diff"
echo "PASS: a snapshot inside an epoch resumes at another world size"

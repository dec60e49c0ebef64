#!/usr/bin/env bash
# Usage: autoencoder_resize_check.sh MPIEXEC DDP_AUTOENCODER PYTHON WORK_DIR (PYTHON: with torch)
# examples/ddp_autoencoder.cpp (a hand-written loop on ddp::StepBoundary, built against the
# installed package) stopped inside an epoch and resumed at another world size (issue 39), on a
# small copy of Fashion-MNIST (768 training images, one epoch), each rank writing the samples it
# trained (its --sample-log):
#   1. 4 ranks x 16 throughout: the reference;
#   2. 4 ranks stopped after step 3 (--stop-at-step 2: rank 0 raises SIGTERM after step 2, agreed
#      at the boundary after step 3; exit 75, a snapshot
#      after batch 3), resumed on 2 ranks: steps 1-3 trained the reference's samples step for
#      step, the rest of the epoch's order (from sample 192) is re-sharded over the 2 ranks as
#      DistributedSampler's start says (each rank's list computed here from PyTorch's
#      DistributedSampler permutation), every sample of the epoch is trained exactly once, and the
#      epoch's metrics count the 576 samples of its rest;
#   3. the same growing: 2 ranks stopped after step 3, resumed on 4 (672 samples re-sharded,
#      the last batch shorter).
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 MPIEXEC DDP_AUTOENCODER PYTHON WORK_DIR" >&2; exit 2; }
mpiexec=$1 program=$2 python=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work/data"
/usr/bin/python3 "$here/mnist_subset.py" "${DDP_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" "$work/data" 768 64
flags=(--data-dir "$work/data" --seed 5 --batch-size 16 --epochs 1 --warmup-steps 2 --workers 0
       --log-interval 0 --no-cuda)
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line of $1 matches: $2"; }; }
# run NAME NP EXPECTED_STATUS [FLAGS...]: samples in $work/NAME.samples, the log in $work/NAME.log.
run() {
  local name=$1 np=$2 expected=$3 status=0
  shift 3
  mkdir -p "$work/$name.samples"
  echo "+ mpirun -np $np ddp_autoencoder $*"
  "$mpiexec" -np "$np" "$program" "${flags[@]}" --sample-log "$work/$name.samples" "$@" \
    > "$work/$name.log" 2>&1 || status=$?
  [ "$status" -eq "$expected" ] || { cat "$work/$name.log"; fail "$name: exit status $status, expected $expected"; }
}
# check REFERENCE STOPPED RESUMED FROM_RANKS TO_RANKS SAMPLES_DONE
check() {
  "$python" - "$work" 768 "$@" <<'PY'
import collections, glob, json, sys
import torch
work, size, ref, stopped, resumed = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
from_ranks, to_ranks, done = map(int, sys.argv[6:9])
def lines(name):  # {rank: [(step, index), ...]} in the order trained
    out = {}
    for path in glob.glob(f"{work}/{name}.samples/rank*of*.txt"):
        rank = int(path.rsplit("rank", 1)[1].split("of")[0])
        out[rank] = [tuple(map(int, l.split()))[1:] for l in open(path)]
    return out
def by_step(runs):
    steps = collections.defaultdict(collections.Counter)
    for run in runs:
        for rank_lines in run.values():
            for step, index in rank_lines:
                steps[step][index] += 1
    return steps
reference, before, after = lines(ref), lines(stopped), lines(resumed)
assert sorted(before) == list(range(from_ranks)), f"stopped run: rank files {sorted(before)}"
assert sorted(after) == list(range(to_ranks)), f"resumed run: rank files {sorted(after)}"
# Steps 1-3 trained what the reference (at the stopped run's world size) trained.
ref_steps, before_steps = by_step([reference]), by_step([before])
assert sorted(before_steps) == [1, 2, 3], f"stopped run trained steps {sorted(before_steps)}"
for step in (1, 2, 3):
    assert before_steps[step] == ref_steps[step], f"step {step} differs from the reference"
# The rest: PyTorch's DistributedSampler order for epoch 1 (seed 5 + epoch 1), from position
# `done`, padded and split over the resumed ranks: what DistributedSampler::set_epoch's start says.
order = torch.randperm(size, generator=torch.Generator().manual_seed(5 + 1)).tolist()
rest = order[done:]
total = -(-len(rest) // to_ranks) * to_ranks
rest += rest[:total - len(rest)]
for rank in range(to_ranks):
    got = [index for _, index in after[rank]]
    assert got == rest[rank::to_ranks], f"resumed rank {rank} trained other samples than its share of the rest"
# Every sample of the epoch exactly once (padding aside: the repeated ones are the padding).
count = collections.Counter(i for run in (before, after) for r in run.values() for _, i in r)
missing = [i for i in range(size) if count[i] == 0]
extra = sum(c - 1 for c in count.values()) - (total - len(order[done:]))
assert not missing and extra == 0, f"{len(missing)} samples missing, {extra} trained twice"
steps_after = sorted(by_step([after]))
assert steps_after == list(range(4, 4 + len(steps_after))), f"resumed steps {steps_after[:3]}..."
rows = [json.loads(l) for l in open(f"{work}/{resumed}.jsonl")]
assert rows[-1]["samples"] == total, (rows[-1], total)
print(f"  {from_ranks} -> {to_ranks} ranks: steps 1-3 as {ref}, the rest ({len(order[done:])} samples "
      f"from {done}) re-sharded as DistributedSampler's start says, steps 4-{steps_after[-1]}; "
      f"every one of the {size} samples trained once; the epoch's metrics count {total}")
PY
}

echo "== 1. the references: 4 x 16 and 2 x 16 throughout"
run four 4 0 --checkpoint-dir "$work/four"
run two 2 0 --checkpoint-dir "$work/two"

echo "== 2. 4 ranks, stopped after step 3, resumed on 2"
run shrink 4 75 --checkpoint-dir "$work/shrink" --stop-at-step 2
expect "$work/shrink.log" "^Stopped by SIGTERM \(rank 0\) before batch 3 of epoch 1 \(step 3\): wrote $work/shrink/snapshot_epoch1_batch3.pt"
run shrink.resumed 2 0 --checkpoint-dir "$work/shrink" --resume --metrics-file "$work/shrink.resumed.jsonl"
expect "$work/shrink.resumed.log" "^Warning: the snapshot was written by 4 rank\(s\), this run has 2: the rest of epoch 1 \(from sample 192 of its order\) is re-sharded over the 2 ranks"
check four shrink shrink.resumed 4 2 192

echo "== 3. 2 ranks, stopped after step 3, resumed on 4"
run grow 2 75 --checkpoint-dir "$work/grow" --stop-at-step 2
run grow.resumed 4 0 --checkpoint-dir "$work/grow" --resume --metrics-file "$work/grow.resumed.jsonl"
expect "$work/grow.resumed.log" "^Warning: the snapshot was written by 2 rank\(s\), this run has 4: the rest of epoch 1 \(from sample 96 of its order\)"
check two grow grow.resumed 2 4 96
echo "autoencoder resize check passed"

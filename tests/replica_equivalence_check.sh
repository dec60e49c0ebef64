#!/usr/bin/env bash
# Replicas in one process train what ranks train (issue 14):
#   mpirun -np 1 ddp_mnist --replicas-per-process 2   against   mpirun -np 2 ddp_mnist
#   mpirun -np 2 ddp_mnist --replicas-per-process 2   against   mpirun -np 4 ddp_mnist
# same seed, a few steps of the seed CNN (dropout included), then --save-model: the saved models
# must be equal to within a tolerance, and the banner must count processes x replicas.
#
# Why a tolerance: the gradient average is the same sum in another order. Replicas of a process
# add their gradients in memory (replica order), then MPI adds the processes' partial sums; MPI
# alone adds the ranks' gradients in the order of its own algorithm, which for large buffers
# (Open MPI's ring all-reduce) is not (a + b) + (c + d). Floating-point addition is not
# associative, so the last bits may differ and a few optimizer steps carry that on. Anything
# else (a wrong shard, a wrong average, shared dropout draws) differs by orders of magnitude more.
#
#   replica_equivalence_check.sh MPIEXEC DDP_MNIST DDP_COMPARE_MODELS WORKDIR
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 MPIEXEC DDP_MNIST DDP_COMPARE_MODELS WORKDIR" >&2; exit 2; }
mpiexec=$1
ddp_mnist=$(realpath "$2")
compare=$(realpath "$3")
work=$4
tolerance=1e-5
rm -rf "$work"
mkdir -p "$work"

# A small copy of Fashion-MNIST (the first 2048 training and 1000 test images, same IDX format):
# the runs train 4 steps, and evaluating 10000 images would take most of the test's time.
data=$work/data
mkdir -p "$data"
/usr/bin/python3 "$(dirname "$0")/mnist_subset.py" "${DDP_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" "$data" 2048 1000

# run NAME NP [FLAGS...]: trains in $work/NAME and keeps its log.
run() {
  local name=$1 np=$2
  shift 2
  mkdir -p "$work/$name"
  echo "+ mpirun -np $np ddp_mnist $* (in $work/$name)"
  (cd "$work/$name" && "$mpiexec" -np "$np" "$ddp_mnist" --epochs 1 --limit-train-batches 4 \
    --log-interval 2 --progress log --seed 3 --data-dir "$data" --save-model "$@") \
    > "$work/$name/log" 2>&1 || { cat "$work/$name/log"; echo "FAIL: $name" >&2; exit 1; }
}
expect() {  # expect FILE REGEX WHAT
  grep -Eq -- "$2" "$1" || { cat "$1"; echo "FAIL: $3: no line matching $2 in $1" >&2; exit 1; }
}

run np1x2 1 --replicas-per-process 2
run np2 2
run np2x2 2 --replicas-per-process 2
run np4 4

expect "$work/np1x2/log" "^ddp: .*: 1 process x 2 replicas = 2 replicas on 1 node, device cpu, 1 thread per replica" "1x2 banner"
expect "$work/np2x2/log" "^ddp: .*: 2 processes x 2 replicas = 4 replicas on 1 node, device cpu, 1 thread per replica" "2x2 banner"
expect "$work/np2/log" "^ddp: .*: 2 ranks on 1 node" "2x1 banner"
expect "$work/np2x2/log" "^Summary over 4 replica\(s\):" "metrics count replicas"
expect "$work/np2x2/log" "^Epoch 1: .* samples/s over 4 replica\(s\)" "epoch line counts replicas"
# The samples seen after 2 steps: 2 x 64 on each replica, counted over all replicas as over ranks.
for log in np2x2 np4; do
  expect "$work/$log/log" "^Train Epoch: 1 \[512/2048" "$log: 4 x 64 samples per step"
done
for log in np1x2 np2; do
  expect "$work/$log/log" "^Train Epoch: 1 \[256/2048" "$log: 2 x 64 samples per step"
done
# One model file, written once (by replica 0 of rank 0), in each run.
for run in np1x2 np2 np2x2 np4; do
  [ "$(ls "$work/$run" | grep -c '\.pt')" -eq 1 ] || { ls -l "$work/$run"; echo "FAIL: $run: not one model file" >&2; exit 1; }
done

"$compare" --tolerance "$tolerance" "$work/np2/mnist_cnn.pt" "$work/np1x2/mnist_cnn.pt"
"$compare" --tolerance "$tolerance" "$work/np4/mnist_cnn.pt" "$work/np2x2/mnist_cnn.pt"
# And the check can fail: 2 ranks train another model than 4 (another global batch).
if "$compare" --tolerance "$tolerance" "$work/np2/mnist_cnn.pt" "$work/np4/mnist_cnn.pt" > "$work/differ.log"; then
  cat "$work/differ.log"
  echo "FAIL: 2 and 4 replicas trained models equal within $tolerance: the comparison cannot fail" >&2
  exit 1
fi
echo "PASS: replicas in one process train what ranks train (within $tolerance)"

#!/usr/bin/env bash
# A resume is exact whatever the run uses, and a changed setting is said (issue 38), with real
# jobs of ddp_mnist at 2 ranks on a small copy of Fashion-MNIST (512 training images):
#   1. --comm-hook powersgd, compressed from step 3 (--powersgd-start-iter 2), SIGTERM on rank 1
#      after step 4, agreed after step 5: exit 75; --resume ends bit-identical to the uninterrupted run (the hook's
#      error feedback, matrices, step count and random generator are in the snapshot);
#   2. the same stop resumed with another --comm-hook, --batch-size and --lr: one warning line for
#      each, naming both values and what it costs; the run trains to its end (status 0).
#
#   resume_exact_check.sh MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP DDP_COMPARE_MODELS WORKDIR
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP DDP_COMPARE_MODELS WORKDIR" >&2; exit 2; }
mpiexec=$1 ddp_mnist=$2 signal_at_step=$3 compare=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
data=$work/data
mkdir -p "$data"
/usr/bin/python3 "$(dirname "$0")/mnist_subset.py" "${DDP_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" "$data" 512 256

flags=(--data-dir "$data" --seed 5 --log-interval 0 --test-batch-size 256 --keep-checkpoints 0
       --epochs 1 --limit-train-batches 8 --powersgd-start-iter 2)
powersgd=(--comm-hook powersgd)
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Fq -- "$2" "$1" || { cat "$1"; fail "no line of $1 has: $2"; }; }
# run NAME STATUS PROGRAM FLAGS...: a 2-rank job, its log in $work/NAME.log, its exit status STATUS.
run() {
  local name=$1 want=$2 status=0
  shift 2
  echo "+ mpirun -np 2 $(basename "$1") ${*:2}"
  "$mpiexec" -np 2 "$@" > "$work/$name.log" 2>&1 || status=$?
  [ $status -eq "$want" ] || { cat "$work/$name.log"; fail "$name: exit status $status, expected $want"; }
}

echo "== 1. PowerSGD stopped after step 5 and resumed: bit-identical"
run full 0 "$ddp_mnist" "${flags[@]}" "${powersgd[@]}" --batch-size 16 --checkpoint-dir "$work/full"
run stopped 75 "$signal_at_step" --signal-at-step=4:1:TERM "${flags[@]}" "${powersgd[@]}" --batch-size 16 \
  --checkpoint-dir "$work/stopped"
snapshot=$work/stopped/snapshot_epoch1_batch5.pt
[ -f "$snapshot" ] || { ls "$work/stopped"; fail "no snapshot after step 5"; }
cp -r "$work/stopped" "$work/changed"
run resumed 0 "$ddp_mnist" "${flags[@]}" "${powersgd[@]}" --batch-size 16 --checkpoint-dir "$work/stopped" --resume
expect "$work/resumed.log" "Resumed from $snapshot: epoch 0 done, 5 batches of epoch 1, step 5"
if grep -q "^Warning: the " "$work/resumed.log"; then cat "$work/resumed.log"; fail "the same settings were called changed"; fi
"$compare" "$work/full/model_with_epoch1.pt" "$work/stopped/model_with_epoch1.pt"

echo "== 2. the same stop resumed with another hook, batch size and learning rate: each named"
cost="the run goes on, but no longer on the trajectory the snapshot's run would have followed"
run changed 0 "$ddp_mnist" "${flags[@]}" --comm-hook allreduce --batch-size 8 --lr 0.5 \
  --checkpoint-dir "$work/changed" --resume
expect "$work/changed.log" "Warning: the per-rank batch size is 8, the snapshot's run had 16: the epoch's sample order is kept, cut into other batches; $cost"
expect "$work/changed.log" "Warning: the comm hook is allreduce, the snapshot's run had powersgd(matrix_approximation_rank=1, start_powerSGD_iter=2, min_compression_rate=2, use_error_feedback=1, warm_start=1, orthogonalization_epsilon=0, random_seed=0): $cost"
expect "$work/changed.log" "Warning: the optimizer is ddp::Adadelta (eps=1e-06, lr=0.5, rho=0.9, weight_decay=0), the snapshot's run had ddp::Adadelta (eps=1e-06, lr=1, rho=0.9, weight_decay=0): the snapshot's settings are restored with its state, so this run's are not used, except a learning rate that this run's schedule sets"
[ -f "$work/changed/model_with_epoch1.pt" ] || fail "the changed run did not finish its epoch"
echo "resume_exact_check passed"

#!/usr/bin/env bash
# The lines of a resume say only what is true (issue 60), with real jobs of ddp_mnist on a small
# copy of Fashion-MNIST (512 training images):
#   1. a finished 2-rank run, whose snapshot case 2 resumes;
#   2. that 2-rank snapshot (the allreduce hook) resumed on 1 rank: no comm-hook warning (no hook
#      at one rank is the same arithmetic as allreduce), the world size's warning only; a 2-rank
#      PowerSGD snapshot resumed on 1 rank still warns (its compression is not used there);
#
#   resume_lines_check.sh MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP WORKDIR
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 MPIEXEC DDP_MNIST DDP_MNIST_SIGNAL_AT_STEP WORKDIR" >&2; exit 2; }
mpiexec=$1 ddp_mnist=$2 signal_at_step=$3 work=$4
rm -rf "$work" && mkdir -p "$work/data"
data=$work/data
/usr/bin/python3 "$(dirname "$0")/mnist_subset.py" "${DDP_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" "$data" 512 64

base=(--data-dir "$data" --seed 5 --test-batch-size 64 --keep-checkpoints 0 --log-interval 0)
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

echo "== 1. a finished 2-rank run"
run done 0 2 "$ddp_mnist" "${flags[@]}" --batch-size 32 --checkpoint-dir "$work/done"
cp -r "$work/done" "$work/done_copy"

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

echo "PASS: the resume's lines say what happens"

#!/usr/bin/env bash
# The examples that parse their own flags (ddp_autoencoder, ddp_dcgan, ddp_dist_mnist) refuse
# what ddp::cli refuses (issue 60), each with status 2 and one line naming the flag, before any
# data is read:
#   1. a flag given twice (they took the last one);
#   2. a --workers beyond ddp::kMaxLoaderWorkers (100000 spent half a minute creating threads,
#      then failed naming nothing).
#
#   example_flags_check.sh MPIEXEC DDP_AUTOENCODER DDP_DCGAN DDP_DIST_MNIST WORKDIR
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 MPIEXEC DDP_AUTOENCODER DDP_DCGAN DDP_DIST_MNIST WORKDIR" >&2; exit 2; }
mpiexec=$1 work=$5
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
# refused PROGRAM LINE FLAGS...: a 1-rank job that ends with status 2 and LINE (a fixed string)
# as a whole line of its output. Its --data-dir does not exist: a program that took the flags
# fails at once on the data (status 1), not after training.
refused() {
  local program=$1 line=$2 status=0
  shift 2
  local log=$work/$(basename "$program").log
  echo "+ mpirun -np 1 $(basename "$program") --data-dir $work/no-data $*"
  "$mpiexec" -np 1 "$program" --data-dir "$work/no-data" "$@" > "$log" 2>&1 || status=$?
  [ $status -eq 2 ] || { cat "$log"; fail "exit status $status, expected 2"; }
  grep -qxF -- "$line" "$log" || { cat "$log"; fail "no line of $log is: $line"; }
}
for program in "$2" "$3" "$4"; do
  name=$(basename "$program")
  echo "== $name"
  refused "$program" "$name: --epochs is given more than once (see --help)" --epochs 2 --epochs 3
  refused "$program" "$name: --workers is given more than once (see --help)" --workers=1 --workers 2
  refused "$program" "$name: --workers must be from 0 to 1024 worker threads (got 100000): the DataLoader starts them all with each pass, and a few per core keep a rank fed (see --help)" --workers 100000
done
echo "PASS: the examples refuse a repeated flag and a huge --workers"

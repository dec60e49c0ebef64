#!/usr/bin/env bash
# Usage: progress_check.sh MPIEXEC DDP_MNIST
# What a user sees during an epoch (--progress auto), checked on the screen's bytes:
#  1. in a pseudo-terminal (script(1), as a person's terminal is), the live bar: one line redrawn
#     with \r, with samples/s and elapsed<ETA, ending at 20/20 100%, and no "Train Epoch" lines;
#  2. into a pipe (a Slurm log, CI), "Train Epoch" lines with an ETA, no bar, and the end-of-run
#     summary table.
set -u
mpiexec=$1
ddp_mnist=$2
run=("$mpiexec" -np 2 "$ddp_mnist" --epochs 1 --limit-train-batches 20 --log-interval 5)
status=0
fail() { echo "progress_check: $*" >&2; status=1; }

screen=$(script -qefc "$(printf '%q ' "${run[@]}")" /dev/null)
printf '%s\n' "$screen" | tr '\r' '\n' | grep -a "Epoch 1 \[" | tail -n 3
grep -aq $'\rEpoch 1 \\[20/20 100%\\] |#*| [0-9]* samples/s loss [0-9.]* 0:[0-9][0-9]<0:00' <<< "$screen" ||
  fail "terminal: no final bar line 'Epoch 1 [20/20 100%] |...| N samples/s loss L m:ss<0:00'"
[ "$(tr -cd '\r' <<< "$screen" | wc -c)" -ge 2 ] || fail "terminal: the bar was not redrawn in place"
grep -aq "Train Epoch" <<< "$screen" && fail "terminal: log lines beside the bar"

piped=$("${run[@]}" 2>&1 | cat)
grep -a "Train Epoch" <<< "$piped"
[ "$(grep -acE $'^Train Epoch: 1 \\[[0-9]+/60000 \\([0-9]+%\\)\\]\tLoss: [0-9.]+\tETA [0-9]+:[0-9][0-9]$' <<< "$piped")" -eq 4 ] ||
  fail "pipe: expected 4 'Train Epoch ... ETA m:ss' lines (batches 0, 5, 10, 15)"
grep -aq $'\r' <<< "$piped" && fail "pipe: a bar (carriage return) in a non-terminal output"
grep -aA2 "^Summary over 2 rank(s):" <<< "$piped"
grep -aqE '^ +1 +[0-9.]+ +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9]+ +[0-9.]+%$' <<< "$piped" ||
  fail "pipe: no end-of-run summary row for epoch 1"
[ $status -eq 0 ] && echo "progress_check: bar on a terminal, log lines with ETA into a pipe"
exit $status

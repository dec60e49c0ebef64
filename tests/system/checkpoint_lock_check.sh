#!/usr/bin/env bash
# Usage: checkpoint_lock_check.sh MPIEXEC DDP_MNIST TMPDIR
# One job per checkpoint directory (src/train/directory_lock.h), with real jobs of 2 ranks:
#   two jobs     job A trains into a directory; while it holds the lock (its rank 0 is held
#                with SIGSTOP, so it cannot end first) job B on the same directory is refused
#                before training, every rank ending, naming A's host and pid; A, continued, ends
#                with status 0 and its files, and leaves no lock file.
#   stale lock   job C's rank 0 is killed (kill -9) while it holds the lock; job D on the same
#                directory takes it over, saying so naming C's rank 0, and trains.
#   one job      2 ranks on this host, both of one job, in a fresh directory: no refusal.
# Prints the time job B takes to be refused (docs/reliability.md).
set -euo pipefail
mpiexec=$1 mnist=$2 tmp=$3
rm -rf "$tmp" && mkdir -p "$tmp"

# An MNIST-format data set (IDX files), large enough for job A to train a few seconds.
python3 - "$tmp/data" <<'PY'
import os, struct, sys
d = sys.argv[1]
os.makedirs(d)
def idx(dims):
    n = 1
    for x in dims: n *= x
    head = bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", x) for x in dims)
    return head + bytes(i % 10 for i in range(n))
for prefix, n in (("train", 2048), ("t10k", 64)):
    open(f"{d}/{prefix}-images-idx3-ubyte", "wb").write(idx([n, 28, 28]))
    open(f"{d}/{prefix}-labels-idx1-ubyte", "wb").write(idx([n]))
PY

train() {
  "$mpiexec" -np 2 "$mnist" --no-cuda --data-dir "$tmp/data" --batch-size 8 --log-interval 50 \
    --timeout 120 "$@"
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
fail() { echo "FAIL: $*" >&2; exit 1; }
host=$(hostname)
# Starts a job of 2 epochs on DIR in the background (output in LOG; its mpirun's pid in $job) and
# waits for DIR's lock file to name its holder (its pid in $pid); then sends the holder SIGNAL.
start_holder() {
  local dir=$1 log=$2 signal=$3
  train --epochs 2 --checkpoint-dir "$dir" > "$log" 2>&1 &
  job=$!
  pid=
  for _ in $(seq 600); do
    [ -s "$dir/.ddp.lock" ] && pid=$(sed -n 's/^host .*, pid \([0-9]*\), since .*/\1/p' "$dir/.ddp.lock")
    [ -n "$pid" ] && break
    sleep 0.05
  done
  [ -n "$pid" ] || fail "$dir/.ddp.lock did not name a holder within 30 s"
  kill "-$signal" "$pid" 2> /dev/null || fail "the job on $dir ended before its rank 0 got SIG$signal: give it more data"
}

echo "== two jobs on one directory"
dir=$tmp/shared
start_holder "$dir" "$tmp/a.log" STOP
job_a=$job
grep -q "^host $host, pid $pid, since [0-9-]* [0-9:]* UTC$" "$dir/.ddp.lock" \
  || fail "the lock file does not name the holder: $(cat "$dir/.ddp.lock")"
start=$(now_ms)
status=0
train --epochs 2 --checkpoint-dir "$dir" > "$tmp/b.log" 2>&1 || status=$?
elapsed=$(( $(now_ms) - start ))
kill -CONT "$pid"
grep -v '^$' "$tmp/b.log" | tail -n 3
[ "$status" -eq 1 ] || fail "job B: exit status $status, not 1"
grep -Eq "ddp: rank 0 \(.*\): CheckpointerOptions::dir: $dir is in use by another job \(host $host, pid $pid, since .* holds $dir/\.ddp\.lock\)" \
  "$tmp/b.log" || fail "job B's message does not name the directory and job A's rank 0"
grep -q "Train Epoch" "$tmp/b.log" && fail "job B trained"
echo "job B refused: exit status $status after $elapsed ms (start-up included)"
status=0
wait "$job_a" || status=$?
[ "$status" -eq 0 ] || { tail -n 5 "$tmp/a.log"; fail "job A: exit status $status after job B's refusal"; }
[ -f "$dir/model_with_epoch2.pt" ] && [ -f "$dir/snapshot_epoch2.pt" ] || fail "job A's epoch-2 files are missing"
[ ! -e "$dir/.ddp.lock" ] || fail "job A left its lock file after a clean end"
grep -q "Took over" "$tmp/a.log" && fail "job A took over a lock"
echo "job A unaffected: exit status 0, epoch 2's files written, its lock file removed"

echo "== a stale lock: its job was killed"
dir=$tmp/stale
start_holder "$dir" "$tmp/c.log" KILL
wait "$job" || true
[ -s "$dir/.ddp.lock" ] || fail "no lock file left by the killed job"
train --epochs 1 --limit-train-batches 2 --checkpoint-dir "$dir" > "$tmp/d.log" 2>&1 \
  || { tail -n 5 "$tmp/d.log"; fail "job D failed"; }
grep -E "^Took over $dir/\.ddp\.lock, left by a job that is gone \(host $host, pid $pid, since .*\)$" \
  "$tmp/d.log" || fail "job D did not say whose lock it took over"
[ ! -e "$dir/.ddp.lock" ] || fail "job D left its lock file"

echo "== one job: 2 ranks on one host"
dir=$tmp/one_job
train --epochs 1 --limit-train-batches 2 --checkpoint-dir "$dir" \
  > "$tmp/e.log" 2>&1 || { tail -n 5 "$tmp/e.log"; fail "2 ranks of one job failed"; }
[ -f "$dir/snapshot_epoch1.pt" ] || fail "no snapshot from the job of 2 ranks"
grep -q "in use by another job" "$tmp/e.log" && fail "the ranks of one job refused each other"
echo "checkpoint_lock_check: every case passed"

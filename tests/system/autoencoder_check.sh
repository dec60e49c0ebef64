#!/usr/bin/env bash
# Usage: autoencoder_check.sh MPIEXEC DDP_AUTOENCODER COMPARE_MODELS WORK_DIR
# examples/ddp_autoencoder.cpp, built from its single file against the installed package, trains
# on 2 ranks on the CPU with every training-step flag and its DataLoader's worker threads, its own
# loop composing the training kit's parts (StopAgreement, Checkpointer, Reporter):
#   1. uninterrupted, 2 epochs: a snapshot and the weights at each epoch end; the test loss falls;
#   2. resumed from the epoch-1 snapshot: the same epoch 2 (losses digit for digit), and a model
#      bit-identical to the uninterrupted one (COMPARE_MODELS: ddp_compare_models);
#   3. stopped inside epoch 1 by a signal, under mpirun: SIGTERM to every rank (as Slurm sends it
#      to every task at the time limit), SIGTERM to rank 1 only, and SIGUSR1 to mpirun, which
#      forwards it (as after `sbatch --signal=USR1@T`): each run exits 75 after a step snapshot
#      naming the signal, and the same command with --resume ends bit-identical to 1;
#   4. a bad flag ends every rank with status 2 and a line naming it.
# (SIGTERM to Open MPI's mpirun itself kills the ranks 1 s later without their output:
# docs/reliability.md.)
set -euo pipefail
mpiexec=$1 program=$2 compare=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
# --log-interval 5 with --accumulate 2: step records fall on batches that step and that do not.
# (Each run gives its --log-interval: the program refuses a flag given twice.)
train=("$mpiexec" -np 2 "$program" --batch-size 32 --limit-train-batches 100 --accumulate 2
       --warmup-steps 3 --lr 0.003 --clip-grad-norm 1 --amp bf16 --workers 2 --no-cuda --epochs 2)
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line of $1 matches: $2"; }; }

echo "== 1. uninterrupted: 2 epochs"
"${train[@]}" --log-interval 5 --metrics-file "$work/full.jsonl" --checkpoint-dir "$work/full" > "$work/full.log"
for f in model_with_epoch1.pt model_with_epoch2.pt snapshot_epoch1.pt snapshot_epoch2.pt; do
  test -f "$work/full/$f" || fail "no $work/full/$f"
done
expect "$work/full.log" "^Summary over 2 rank\(s\):"
python3 - "$work/full.jsonl" <<'PY'
import json, math, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
rows = [r for r in lines if "kind" not in r]  # the epoch lines
steps = [r for r in lines if r.get("kind") == "step"]  # every --log-interval batches
assert [r["epoch"] for r in rows] == [1, 2], rows
# The loop passes the lr always, the norm where a batch stepped (--accumulate: not every one).
assert steps and all("lr" in s for s in steps) and any("grad_norm" in s for s in steps), steps
for r in rows:
    for key in ("train_loss", "test_loss", "samples_per_sec"):
        assert math.isfinite(r[key]) and r[key] > 0, (key, r)
assert rows[1]["test_loss"] < rows[0]["test_loss"], ("test loss did not fall", rows)
print("test loss %.6f -> %.6f" % (rows[0]["test_loss"], rows[1]["test_loss"]))
PY

echo "== 2. stopped after epoch 1 (its snapshot and metrics), then --resume: the same epoch 2"
mkdir -p "$work/resumed"
cp "$work/full/snapshot_epoch1.pt" "$work/resumed/"
sed -n '1,/^{"epoch":1,/p' "$work/full.jsonl" > "$work/resumed.jsonl"  # up to epoch 1's line
"${train[@]}" --log-interval 5 --metrics-file "$work/resumed.jsonl" --checkpoint-dir "$work/resumed" --resume \
  > "$work/resumed.log"
expect "$work/resumed.log" "^Resumed from $work/resumed/snapshot_epoch1.pt: epoch 1 done, step 50$"
python3 - "$work/full.jsonl" "$work/resumed.jsonl" <<'PY'
import json, sys
full_lines, resumed_lines = ([json.loads(line) for line in open(path)] for path in sys.argv[1:3])
full, resumed = ([r for r in lines if "kind" not in r] for lines in (full_lines, resumed_lines))
assert len(resumed) == 2, resumed  # --resume keeps epoch 1's line and appends epoch 2's
# ... and the step records: epoch 2's the same steps and losses as uninterrupted.
steps = lambda lines: [(r["step"], r["loss"]) for r in lines if r.get("kind") == "step"]
assert steps(full_lines) == steps(resumed_lines), (steps(full_lines), steps(resumed_lines))
for key in ("epoch", "train_loss", "test_loss", "samples"):
    assert full[1][key] == resumed[1][key], ("resumed run differs", key, full[1], resumed[1])
print("epoch 2 resumed equals epoch 2 uninterrupted: train loss %r, test loss %r"
      % (resumed[1]["train_loss"], resumed[1]["test_loss"]))
PY
"$compare" "$work/full/model_with_epoch2.pt" "$work/resumed/model_with_epoch2.pt"

# stop NAME HOW SIGNAL: a run signalled once rank 0 has logged its first batch; HOW is "ranks"
# (every rank), "rank1" or "mpirun". It must exit 75 after a snapshot inside an epoch, naming
# SIGNAL; --resume then ends bit-identical to the uninterrupted run.
stop() {
  local name=$1 how=$2 signal=$3 dir=$work/$1 log=$work/$1.log
  echo "== 3. SIG$signal to $how, inside epoch 1"
  "${train[@]}" --log-interval 1 --checkpoint-dir "$dir" > "$log" 2>&1 &
  local job=$! status=0 targets
  for _ in $(seq 600); do
    grep -q "^Epoch 1 \[" "$log" && break
    sleep 0.05
  done
  case $how in
    mpirun) targets=$job ;;
    ranks) targets=$(pgrep -P "$job" -x ddp_autoencoder) ;;
    rank1) for p in $(pgrep -P "$job" -x ddp_autoencoder); do
             tr '\0' '\n' < "/proc/$p/environ" | grep -qx OMPI_COMM_WORLD_RANK=1 && targets=$p
           done ;;
  esac
  [ -n "$targets" ] || { kill -9 "$job"; fail "$name: no process to signal"; }
  kill -"$signal" $targets
  wait "$job" || status=$?
  grep -v "^Epoch 1 \[" "$log" | grep -v '^$' | head -n 6
  [ "$status" -eq 75 ] || { cat "$log"; fail "$name: exit status $status, expected 75"; }
  local rank="[01]"
  [ "$how" = rank1 ] && rank=1
  expect "$log" "^Stopped by SIG$signal \(rank $rank\) before batch [0-9]+ of epoch [12] \(step [0-9]+\): wrote $dir/snapshot_epoch[12]_batch[0-9]+.pt [0-9.]+ s after the signal"
  [ -n "$(ls "$dir"/snapshot_epoch*_batch*.pt 2> /dev/null)" ] || fail "$name: no snapshot inside an epoch"
  [ ! -f "$dir/model_with_epoch2.pt" ] || fail "$name: epoch 2 must not have ended"
  "${train[@]}" --log-interval 5 --checkpoint-dir "$dir" --resume > "$work/$name-resumed.log"
  # An epoch here lasts about 0.35 s: a signal that mpirun forwards late may land at the step
  # boundary that starts epoch 2 (snapshot_epoch2_batch0.pt, "epoch 1 done, step 50"), which is
  # as correct a stop as one inside epoch 1.
  expect "$work/$name-resumed.log" "^Resumed from $dir/snapshot_epoch[12]_batch[0-9]+.pt: epoch [01] done(, [0-9]+ batches of epoch [12])?, step [0-9]+$"
  "$compare" "$work/full/model_with_epoch2.pt" "$dir/model_with_epoch2.pt"
}
stop term_ranks ranks TERM
stop term_rank1 rank1 TERM
stop usr1_mpirun mpirun USR1

echo "== 4. a bad flag: status 2, one line naming it"
set +e
"$mpiexec" -np 2 "$program" --batch-size 0 > "$work/bad.log" 2>&1
status=$?
set -e
cat "$work/bad.log"
test "$status" -eq 2
grep -q "^ddp_autoencoder: --batch-size must be >= 1 (got 0) (see --help)$" "$work/bad.log"
echo "autoencoder check passed"

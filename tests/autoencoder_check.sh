#!/usr/bin/env bash
# Usage: autoencoder_check.sh MPIEXEC DDP_AUTOENCODER WORK_DIR
# examples/ddp_autoencoder.cpp, built from its single file against the installed package, trains
# on 2 ranks with every training-step flag: its test loss falls from epoch 1 to epoch 2; the same
# run stopped after epoch 1 and resumed from its checkpoint gives the same losses, digit for
# digit; a bad flag ends every rank with status 2 and a line naming it.
set -euo pipefail
mpiexec=$1 program=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
train=("$mpiexec" -np 2 "$program" --batch-size 32 --limit-train-batches 15 --accumulate 2
       --warmup-steps 3 --lr 0.003 --clip-grad-norm 1 --amp bf16 --workers 2 --no-cuda)

echo "== uninterrupted: 2 epochs"
"${train[@]}" --epochs 2 --metrics-file "$work/full.jsonl" --checkpoint-dir "$work/full"
test -f "$work/full/checkpoint_epoch1.pt" && test -f "$work/full/checkpoint_epoch2.pt"

echo "== the test loss falls"
python3 - "$work/full.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert [r["epoch"] for r in rows] == [1, 2], rows
for r in rows:
    for key in ("train_loss", "test_loss", "samples_per_sec"):
        assert math.isfinite(r[key]) and r[key] > 0, (key, r)
assert rows[1]["test_loss"] < rows[0]["test_loss"], ("test loss did not fall", rows)
print("test loss %.6f -> %.6f" % (rows[0]["test_loss"], rows[1]["test_loss"]))
PY

echo "== stopped after epoch 1 (its checkpoint and metrics), then --resume: the same epoch 2"
mkdir -p "$work/resumed"
cp "$work/full/checkpoint_epoch1.pt" "$work/resumed/"
head -n 1 "$work/full.jsonl" > "$work/resumed.jsonl"
"${train[@]}" --epochs 2 --metrics-file "$work/resumed.jsonl" --checkpoint-dir "$work/resumed" \
  --resume | tee "$work/resumed.log"
grep -q "Resumed from $work/resumed/checkpoint_epoch1.pt after epoch 1" "$work/resumed.log"
test -f "$work/resumed/checkpoint_epoch2.pt"
python3 - "$work/full.jsonl" "$work/resumed.jsonl" <<'PY'
import json, sys
full, resumed = ([json.loads(line) for line in open(path)] for path in sys.argv[1:3])
assert len(resumed) == 2, resumed  # --resume appends to the metrics file
for key in ("epoch", "train_loss", "test_loss"):
    assert full[1][key] == resumed[1][key], ("resumed run differs", key, full[1], resumed[1])
print("epoch 2 resumed equals epoch 2 uninterrupted: train loss %r, test loss %r"
      % (resumed[1]["train_loss"], resumed[1]["test_loss"]))
PY

echo "== a bad flag: status 2, one line naming it"
set +e
"$mpiexec" -np 2 "$program" --batch-size 0 > "$work/bad.log" 2>&1
status=$?
set -e
cat "$work/bad.log"
test "$status" -eq 2
grep -q "^ddp_autoencoder: --batch-size must be >= 1 (got 0) (see --help)$" "$work/bad.log"
echo "autoencoder check passed"

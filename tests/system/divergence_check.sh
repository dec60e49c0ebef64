#!/usr/bin/env bash
# Training that diverges (issue 26: `--lr 1e30` trained on NaN, wrote NaN checkpoints and exited
# 0), on 2 ranks of ddp_mnist, 4 batches an epoch.
#   stop  epoch 1 trains at --lr 1; StepLR's --gamma 1e30 makes epoch 2's rate 1e30. The job
#         exits 3 (ddp::kDivergedExitCode), saying the step, epoch 2 and what was not finite.
#         With --keep-checkpoints 1 and a snapshot every 2 steps, epoch 1's files are still there,
#         byte-identical to those of a run that ended after epoch 1; no epoch-2 file exists; every
#         model file left holds finite tensors only (read with PyTorch; the snapshots' own format
#         it cannot read, and the Checkpointer refuses non-finite ones: unit test
#         Divergence.CheckpointerNeverWritesNorRotatesForANonFiniteModel).
#   skip  --lr 1e30 --on-nonfinite skip --max-skipped-steps 2: the dropped steps are said with
#         their count, then the job exits 3 after 2 in a row. (At 1e30 the first update already
#         overflows, so no later step can recover: dropping steps that recover is unit-tested,
#         Divergence.SkipDropsTheStepAndItsSumsThenStopsAfterTheLimitInARow.)
# Usage: divergence_check.sh MPIEXEC DDP_MNIST PYTHON TMPDIR
set -u
mpiexec=$1 mnist=$2 python=$3 tmp=$4
rm -rf "$tmp" && mkdir -p "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }
train() {
  "$mpiexec" -np 2 "$mnist" --no-cuda --limit-train-batches 4 --log-interval 0 --seed 1 "$@"
}
# Every floating-point tensor of every file (parameters and buffers of the archive's modules,
# nested ones included) is finite.
all_finite() {
  "$python" - "$@" <<'PY'
import sys, torch
bad, count = [], 0
for path in sys.argv[1:]:
    archive = torch.jit.load(path, map_location="cpu")
    for name, t in list(archive.named_parameters()) + list(archive.named_buffers()):
        count += 1
        if t.is_floating_point() and not torch.isfinite(t).all():
            bad.append(f"{path}: {name}")
print(f"{count} tensors in {len(sys.argv) - 1} file(s)" + (": not finite: " + ", ".join(bad) if bad else ", all finite"))
sys.exit(1 if bad or count == 0 else 0)
PY
}

echo "== stop: a run that ends after epoch 1 (the reference files)"
reference=$tmp/reference
train --epochs 1 --gamma 1e30 --checkpoint-dir "$reference" --keep-checkpoints 1 --checkpoint-every-steps 2 \
  > "$tmp/reference.log" 2>&1 || { cat "$tmp/reference.log"; fail "the epoch-1 run failed"; }
echo "== stop: epochs 1 to 3, epoch 2 at a rate of 1e30"
dir=$tmp/diverged
status=0
train --epochs 3 --gamma 1e30 --checkpoint-dir "$dir" --keep-checkpoints 1 \
  --checkpoint-every-steps 2 > "$tmp/stop.log" 2>&1 || status=$?
grep -v '^$' "$tmp/stop.log" | tail -n 4
[ "$status" -eq 3 ] || fail "exit status $status, not 3"
grep -Eq "^Training diverged at step [5-8] \(epoch 2\): (the gradients are not finite \(largest \|gradient\| (nan|inf)\)|the loss of rank [01] was not finite \(first at step [5-8]\)|the epoch's training loss over all ranks is (nan|inf)), learning rate 1e\+30\." "$tmp/stop.log" ||
  fail "no message naming the step, epoch 2, what was not finite and the rate"
grep -q "^Exit status 3: training diverged (try a lower --lr" "$tmp/stop.log" || fail "no exit line"
! grep -q "refusing to write" "$tmp/stop.log" || fail "the Checkpointer had to refuse: the Trainer saw it late"
for f in model_with_epoch1.pt snapshot_epoch1.pt; do
  cmp "$reference/$f" "$dir/$f" || fail "$dir/$f differs from the epoch-1 run's (or is gone)"
done
! ls "$dir" | grep -q "epoch2\.pt\|epoch3" || fail "an epoch-2 file was written: $(ls "$dir")"
! ls "$dir" | grep -q "\.tmp\." || fail "a temporary file was left: $(ls "$dir")"
echo "files left: $(ls "$dir" | tr '\n' ' ')"
all_finite "$dir"/model_with_*.pt || fail "a file holds a tensor that is not finite"

echo "== skip: --lr 1e30 --on-nonfinite skip --max-skipped-steps 2"
status=0
train --epochs 2 --lr 1e30 --on-nonfinite skip --max-skipped-steps 2 > "$tmp/skip.log" 2>&1 || status=$?
grep -v '^$' "$tmp/skip.log" | tail -n 5
[ "$status" -eq 3 ] || fail "skip: exit status $status, not 3"
grep -Eq "^Skipped step [0-9]+ \(epoch 1\): the gradients are not finite .*; 1 in a row \(at most 2\), 1 in this run" "$tmp/skip.log" ||
  fail "skip: no line for the first dropped step"
grep -Eq "^Skipped step [0-9]+ \(epoch 1\): .*; 2 in a row \(at most 2\), 2 in this run" "$tmp/skip.log" ||
  fail "skip: no line for the second dropped step"
grep -Eq "^Training diverged at step [0-9]+ \(epoch 1\): the gradients are not finite .*, after 2 dropped step\(s\) in a row" "$tmp/skip.log" ||
  fail "skip: no stop after the limit"
echo "divergence_check: passed"

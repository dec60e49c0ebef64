#!/usr/bin/env bash
# The optimizer step overlapped with the last buckets' all-reduce (hook_then_optimizer, --overlap-step) against
# the plain step after backward and against PyTorch DDP (gloo), on this host: the seed MNIST CNN
# (SGD with momentum, batch 64 per rank) at NP ranks, ROUNDS rounds, the three alternating within
# each round so that load and frequency drift hit all three alike. Prints one table (the median
# over the rounds of each run's median window, samples/s) and the issue's target: the overlapped
# step at least 1.15x PyTorch DDP at 2 ranks. Appends every run to RESULTS/overlap_step.jsonl.
#   bench/overlap_step.sh RESULTS_DIR
# DDP_BENCH_NP (2), DDP_BENCH_ROUNDS (3), DDP_BENCH_WINDOWS (5), DDP_BENCH_WINDOW_STEPS (20).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
results=${1:?usage: overlap_step.sh RESULTS_DIR}
np=${DDP_BENCH_NP:-2}
rounds=${DDP_BENCH_ROUNDS:-3}
common=(--model cnn --batch-size 64 --warmup-steps 5 --window-steps "${DDP_BENCH_WINDOW_STEPS:-20}"
        --windows "${DDP_BENCH_WINDOWS:-5}")
python=$root/.venv/bin/python
mkdir -p "$results"
out=$results/overlap_step.jsonl
: > "$out"
export OMP_NUM_THREADS=1
mpi=(mpirun -np "$np" --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
for ((r = 1; r <= rounds; r++)); do
  echo "round $r of $rounds"
  "${mpi[@]}" "$build/bench/bench_throughput" "${common[@]}" --label ddp-plain --out "$out"
  "${mpi[@]}" "$build/bench/bench_throughput" "${common[@]}" --overlap-step --label ddp-overlap --out "$out"
  "${mpi[@]}" "$python" "$root/bench/pytorch_ddp.py" "${common[@]}" --label pytorch-ddp --out "$out"
done
"$python" - "$out" "$np" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
by = {}
for run in runs:
    by.setdefault(run["impl"], []).append(run["samples_per_sec"])
med = {impl: statistics.median(v) for impl, v in by.items()}
base = med["pytorch-ddp"]
print(f"\nseed CNN, {sys.argv[2]} ranks, batch 64 per rank, SGD momentum 0.9 (samples/s; median of rounds)")
print(f"{'impl':<14} {'samples/s':>10} {'vs PyTorch':>11} {'rounds':>30}")
for impl in ("ddp-plain", "ddp-overlap", "pytorch-ddp"):
    rounds = ", ".join(f"{x:.0f}" for x in by[impl])
    print(f"{impl:<14} {med[impl]:>10.1f} {med[impl] / base:>10.2f}x {rounds:>30}")
ratio = med["ddp-overlap"] / base
print(f"overlapped step vs PyTorch DDP: {ratio:.2f}x (target 1.15x): {'met' if ratio >= 1.15 else 'MISSED'}")
print(f"overlapped vs plain ddp step: {med['ddp-overlap'] / med['ddp-plain']:.2f}x")
PY

#!/usr/bin/env bash
# Time per (partial) CIFAR-10 epoch on this machine's CPU, 1 rank (`cifar`) vs 2 ranks
# (`ddp_cifar`), for the small CNN and ResNet-18, with the same global batch and sample count:
# 1 rank x batch 2B x N steps against 2 ranks x batch B x N steps. Prints one Markdown table row
# per run (the numbers quoted in docs/cifar.md).
# The data is CIFAR-format synthetic data of CIFAR-10's size (tests/make_cifar_data): this
# machine has no internet (a 1000-image test set keeps evaluation short). Speed does not depend
# on pixel values.
# Usage: bench/cifar_epoch.sh [STEPS] (default 20); DDP_BUILD_DIR picks the build tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
steps=${1:-20}
. "$root/scripts/mpi_env.sh"
export OMP_NUM_THREADS=1
data=$build/bench-results/cifar_synthetic
[ -f "$data/test_batch.bin" ] || "$build/tests/make_cifar_data" "$data" --train 50000 --test 1000 > /dev/null

echo "| model | ranks | batch per rank | steps | epoch part (s) | samples/s | data | forward+backward | sync | optimizer |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for model in cnn resnet18; do
  for ranks in 1 2; do
    batch=$((64 / ranks))
    program=$build/examples/ddp_cifar
    [ "$ranks" = 1 ] && program=$build/examples/cifar
    metrics=$(mktemp)
    mpirun -np "$ranks" "$program" --data-dir "$data" --model "$model" --epochs 1 \
      --batch-size "$batch" --limit-train-batches "$steps" --log-interval 0 \
      --test-batch-size 500 --metrics-file "$metrics" > /dev/null
    /usr/bin/python3 - "$metrics" "$model" "$ranks" "$batch" "$steps" <<'PY'
import json, sys
m = json.loads(open(sys.argv[1]).read().splitlines()[-1])
pct = lambda k: "%.1f%%" % (100 * m[k] / m["seconds"])
print("| %s | %s | %s | %s | %.1f | %.1f | %s | %s | %s | %s |" % (
    sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], m["seconds"], m["samples_per_sec"],
    pct("data_seconds"), pct("forward_backward_seconds"), pct("sync_seconds"),
    pct("optimizer_seconds")))
PY
    rm -f "$metrics"
  done
done

#!/usr/bin/env bash
# Runs every benchmark and writes docs/records/performance.md and docs/img/*.png:
#   1. all-reduce bandwidth (ddp communicator vs raw MPI_Allreduce), 2 and 4 ranks
#   2. training throughput: ddp bucketed, ddp per-parameter and PyTorch DDP (gloo), models
#      mlp / cnn / resnet18, 1, 2 and 4 ranks on this host
#   3. the same at 2 ranks across two emulated hosts (network namespaces, tbf-shaped links at
#      1 Gbit/s and 100 Mbit/s), needs root
#   4. a timeline picture of a 2-rank step
# Takes about 17 minutes on 2 cores (2026-11-22); run it on an otherwise idle machine.
# Usage: bench/run_all.sh [--quick]   (--quick: fewer and shorter windows, for a smoke test)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
results=${DDP_BENCH_RESULTS:-$build/bench-results}
quick=0
[ "${1:-}" = "--quick" ] && quick=1

"$root/scripts/setup.sh"
# Plots only: matplotlib draws the PNGs (Debian's python3-matplotlib).
dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q 'install ok installed' ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-matplotlib; }
"$root/scripts/build.sh" > "$results.build.log" 2>&1 || { tail -n 30 "$results.build.log"; exit 1; }

. "$root/scripts/mpi_env.sh"
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The torch wheel ddp is built against runs PyTorch DDP; Debian's python3 draws the plots.
python=${DDP_PYTHON:-$root/.venv/bin/python}
export DDP_PYTHON=$python
plot_python=/usr/bin/python3
rm -rf "$results" && mkdir -p "$results" "$root/docs/img"
commands=$results/commands.txt

# Logs the command for docs/records/performance.md, then runs it.
run() {
  echo "$*" | sed "s|$root/||g" >> "$commands"
  "$@"
}

{
  echo "date:      $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu:       $(lscpu | sed -n 's/^Model name: *//p') ($(nproc --all) cores)"
  echo "memory:    $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "os:        $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
  echo "torch:     $($python -c 'import torch; print(torch.__version__, "(CUDA", torch.version.cuda, "build), pip wheel in", torch.__path__[0])') -- LibTorch for ddp (C++) and PyTorch DDP (Python) alike"
  echo "blas:      $($python -c 'import torch, re; print(re.search(r"BLAS_INFO=(\w+)", torch.__config__.show()).group(1))') (the wheel's own)"
  echo "mpi:       $(mpirun --version | head -n 1)"
  echo "ddp:       $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo '+changes')"
} > "$results/machine.txt"

echo "== all-reduce bandwidth"
for np in 2 4; do
  run mpirun -np "$np" "$build/bench/bench_allreduce" --min-bytes 4096 --max-bytes 268435456 |
    grep -v '^ddp:' | tee "$results/allreduce_np$np.txt"
done

# Per model: batch per rank, warm-up steps, steps per window.
declare -A batch=([mlp]=64 [cnn]=64 [resnet18]=16)
declare -A warmup=([mlp]=50 [cnn]=3 [resnet18]=1)
declare -A window=([mlp]=500 [cnn]=10 [resnet18]=3)
windows=7
if [ $quick = 1 ]; then windows=2; window=([mlp]=20 [cnn]=2 [resnet18]=1); fi

# One measurement of each implementation; $1 = model, $2 = ranks, $3 = output, rest: mpirun flags.
measure_all() {
  local model=$1 np=$2 out=$3
  shift 3
  local common=(--batch-size "${batch[$model]}" --warmup-steps "${warmup[$model]}"
                --window-steps "${window[$model]}" --windows "$windows" --out "$out")
  for sync in bucketed per-parameter; do
    run mpirun -np "$np" "$@" "$build/bench/bench_throughput" --model "$model" --grad-sync "$sync" "${common[@]}"
  done
  run mpirun -np "$np" "$@" $python "$root/bench/pytorch_ddp.py" --model "$model" "${common[@]}"
}

echo "== training throughput, this host"
for model in mlp cnn resnet18; do
  for np in 1 2 4; do
    measure_all "$model" "$np" "$results/throughput.jsonl" 2>&1 | grep -v '^ddp:'
  done
done

echo "== two emulated hosts"
if [ "$(id -u)" -eq 0 ] && [ -x "$root/bench/emulated_hosts.sh" ]; then
  "$root/bench/emulated_hosts.sh" "$results" "$quick" || echo "emulated hosts: failed (see above)"
else
  echo "emulated hosts: skipped (needs root and bench/emulated_hosts.sh)"
fi

echo "== timeline"
run mpirun -np 2 "$build/bench/bench_throughput" --model cnn --warmup-steps 2 --window-steps 3 --windows 1 \
  --timeline "$results/timeline_cnn_2ranks.json" | grep -v '^ddp:'
run $plot_python "$root/scripts/timeline_png.py" "$results/timeline_cnn_2ranks.json" "$root/docs/img/timeline_cnn_2ranks.png" \
  --title "ddp, seed MNIST CNN, 2 ranks, batch 64 per rank: bucket all-reduces during backward"

echo "== report"
$plot_python "$root/bench/plot.py" --out-dir "$root/docs/img" "$results"/*.jsonl
$plot_python "$root/bench/report.py" --results "$results" --out "$root/docs/records/performance.md"

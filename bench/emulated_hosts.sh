#!/usr/bin/env bash
# Training throughput on two emulated hosts: network namespaces h1 and h2 (DDP_BENCH_RANKS_PER_HOST
# ranks each, default 1) joined by a link shaped with tc tbf, Open MPI (and gloo) over that link
# only. For each link rate and model, with one rank per host: ddp bucketed, ddp per-parameter,
# ddp bucketed with bf16 on the wire, and PyTorch DDP; with several: ddp bucketed through the
# hierarchical all-reduce (--hierarchical on: one leader per host), ddp bucketed flat
# (--hierarchical off) and PyTorch DDP. Appends to RESULTS/emulated.jsonl and logs commands to
# RESULTS/commands.txt. Called by bench/run_all.sh; needs root.
#   bench/emulated_hosts.sh RESULTS_DIR [QUICK(0|1)]
# DDP_BENCH_MODELS and DDP_BENCH_LINKS pick a subset (default: mlp cnn resnet18; 1gbit 100mbit);
# DDP_* and OMP_* settings of the caller reach the ranks (DDP_MPI_BLOCKING_KIB=1024, say).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
results=$1
quick=${2:-0}
per_host=${DDP_BENCH_RANKS_PER_HOST:-1}
ranks=$((2 * per_host))
. "$root/tests/cluster/netns_hosts.sh"

netns_bench_hosts hosts "$per_host"

# Runs the job (all ranks) logged in on h1, as a user on a real cluster would with ddprun.
launch() {
  echo "ddprun --hostfile hostfile --iface eth0 -n $ranks -t 1 $*" | sed "s|$root/||g" >> "$results/commands.txt"
  netns_launch "$ranks" 1 "$@"  # the caller's DDP_* and OMP_* settings go along
}

# launch, then the bytes that crossed h1's link during the run (both directions).
measured() {
  local before
  before=$(netns_bytes h1)
  launch "$@"
  echo "    $(( ($(netns_bytes h1) - before) / 1000000 )) MB crossed h1's link"
}

declare -A batch=([mlp]=64 [cnn]=64 [resnet18]=16)
declare -A warmup=([mlp]=20 [cnn]=2 [resnet18]=1)
declare -A window=([mlp]=100 [cnn]=4 [resnet18]=2)
windows=5
if [ "$quick" = 1 ]; then windows=2; window=([mlp]=10 [cnn]=2 [resnet18]=1); fi

for rate in ${DDP_BENCH_LINKS:-1gbit 100mbit}; do
  netns_shape h1 "$rate"
  netns_shape h2 "$rate"
  for model in ${DDP_BENCH_MODELS:-mlp cnn resnet18}; do
    common=(--model "$model" --batch-size "${batch[$model]}" --warmup-steps "${warmup[$model]}"
            --window-steps "${window[$model]}" --windows "$windows" --out "$results/emulated.jsonl")
    before=$(netns_bytes h1)
    if [ "$per_host" -gt 1 ]; then
      measured "$build/bench/bench_throughput" "${common[@]}" --link "$rate" --grad-sync bucketed --hierarchical on
      measured "$build/bench/bench_throughput" "${common[@]}" --link "$rate" --grad-sync bucketed --hierarchical off
    else
      launch "$build/bench/bench_throughput" "${common[@]}" --link "$rate" --grad-sync bucketed
      launch "$build/bench/bench_throughput" "${common[@]}" --link "$rate" --grad-sync per-parameter
      launch "$build/bench/bench_throughput" "${common[@]}" --link "$rate" --grad-sync bucketed --comm-hook bf16
    fi
    measured "${DDP_PYTHON:-$root/.venv/bin/python}" "$root/bench/pytorch_ddp.py" "${common[@]}" --link "$rate"
    echo "  $model at $rate: $(( ($(netns_bytes h1) - before) / 1000000 )) MB crossed h1's link"
  done
done

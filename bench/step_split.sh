#!/usr/bin/env bash
# Where a step's time goes on a slow link (issue 42): two emulated hosts (bench/emulated_hosts.sh's
# network namespaces), one rank each, the link shaped to RATE; in alternating rounds
# ddp_mnist (the Trainer: Adadelta, the step boundary's agreement, reporting), bench_throughput's
# bare DDP loop (SGD), PyTorch DDP (SGD, gloo) and PyTorch DDP with ddp_mnist's optimizer
# (Adadelta) on the seed CNN, batch 64 per rank. The two ddp programs write timelines;
# bench/timeline_split.py prints each phase's median per rank.
#   bench/step_split.sh OUT_DIR [RATE (100mbit)] [ROUNDS (2)]     needs root and a build
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
python=${DDP_PYTHON:-$root/.venv/bin/python}
out=$1 rate=${2:-100mbit} rounds=${3:-2}
mkdir -p "$out" && out=$(cd "$out" && pwd)
. "$root/tests/cluster/netns_hosts.sh"
netns_bench_hosts split 1
launch() { netns_launch 2 1 "$@"; }
netns_shape h1 "$rate"
netns_shape h2 "$rate"
for round in $(seq 1 "$rounds"); do
  echo "round $round, $rate:"
  printf '  ddp_mnist:        '
  launch "$build/examples/ddp_mnist" --epochs 1 --limit-train-batches 30 --batch-size 64 \
    --test-batch-size 1000 --log-interval 0 --progress none --timeline "$out/trainer$round.json" |
    grep -E "^Epoch 1:" | cut -d'|' -f1
  printf '  bench_throughput: '
  launch "$build/bench/bench_throughput" --model cnn --batch-size 64 --warmup-steps 2 --window-steps 10 \
    --windows 2 --timeline "$out/bare$round.json" | grep -E "samples/s" | sed 's/  */ /g'
  for optimizer in sgd adadelta; do
    printf '  PyTorch DDP, %-9s' "$optimizer:"
    launch "$python" "$root/bench/pytorch_ddp.py" --model cnn --batch-size 64 --warmup-steps 2 \
      --window-steps 10 --windows 2 --optimizer "$optimizer" --link "$rate" --phases |
      grep -E "samples/s|phases|Error"
  done
done
"$python" "$root/bench/timeline_split.py" "$out"/trainer*.json "$out"/bare*.json

#!/usr/bin/env bash
# PowerSGD against fp32 where the link is the limit: ddp_mnist (the seed CNN, Adadelta, batch 64
# per rank) for EPOCHS epochs at 2 ranks on two emulated hosts (network namespaces h1 and h2, one
# rank each, joined by a link shaped with tc tbf to RATE), once with the plain all-reduce and once
# with --comm-hook powersgd. Prints one table (samples/s of the epochs after the first, test
# accuracy after the last, bytes that crossed h1's link) and checks the issue's two targets:
# PowerSGD at least 4x the samples/s of fp32, and its accuracy within 1 point of fp32's.
# Writes RESULTS/powersgd_<hook>.jsonl (ddp_mnist's --metrics-file), RESULTS/commands.txt and
# the curves of both runs (scripts/plot_metrics.py) to PLOT. Needs root (namespaces, tc).
#   bench/powersgd_accuracy.sh RESULTS_DIR PLOT.png
# DDP_BENCH_EPOCHS (3), DDP_BENCH_LINK (100mbit), DDP_BENCH_POWERSGD_RANK (4) and
# DDP_BENCH_POWERSGD_START (100: uncompressed steps first, as powerSGD_hook's start_powerSGD_iter);
# DDP_BENCH_LIMIT_BATCHES=N trains N batches per epoch, to try the script quickly.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
results=${1:?usage: powersgd_accuracy.sh RESULTS_DIR PLOT.png}
plot=${2:?usage: powersgd_accuracy.sh RESULTS_DIR PLOT.png}
epochs=${DDP_BENCH_EPOCHS:-3}
rate=${DDP_BENCH_LINK:-100mbit}
psgd_rank=${DDP_BENCH_POWERSGD_RANK:-4}
psgd_start=${DDP_BENCH_POWERSGD_START:-100}
limit=${DDP_BENCH_LIMIT_BATCHES:-0}
mkdir -p "$results"
results=$(cd "$results" && pwd)
. "$root/tests/cluster/netns_hosts.sh"

netns_bench_hosts psgd 1
netns_shape h1 "$rate"
netns_shape h2 "$rate"
agent=$root/tests/cluster/netns_agent.sh

# One 2-rank ddp_mnist, logged in on h1 as a user would be, started by ddprun.
train() {
  local hook=$1; shift
  local out=$results/powersgd_$hook.jsonl line
  rm -f "$out"
  echo "ddprun --hostfile hostfile --iface eth0 -n 2 -t 1 ddp_mnist --epochs $epochs" \
       "--limit-train-batches $limit --metrics-file $out $*  # link $rate" | sed "s|$root/||g" >> "$results/commands.txt"
  printf -v line '%q ' env OMP_NUM_THREADS=1 OMPI_MCA_plm_rsh_agent="$agent" \
    OMPI_MCA_plm_rsh_no_tree_spawn=1 DDP_NETNS_PREFIX="$prefix" DDP_NETNS_HOSTS="$work/hosts" \
    "$root/launch/ddprun" --hostfile "$work/hostfile" --iface eth0 -n 2 -t 1 \
    "$build/examples/ddp_mnist" --epochs "$epochs" --progress none --metrics-file "$out" \
    --limit-train-batches "$limit" "$@"
  local before
  before=$(netns_bytes h1)
  "$agent" h1 "cd $(printf %q "$work") && $line" > "$results/powersgd_$hook.log" 2>&1 ||
    { tail -20 "$results/powersgd_$hook.log"; echo "powersgd_accuracy: the $hook run failed" >&2; exit 1; }
  echo $(( $(netns_bytes h1) - before )) > "$work/$hook.bytes"
}

train allreduce
train powersgd --comm-hook powersgd --powersgd-rank "$psgd_rank" --powersgd-start-iter "$psgd_start"

status=0
/usr/bin/python3 - "$results" "$work" "$rate" "$psgd_rank" "$psgd_start" <<'EOF' || status=$?
import json, statistics, sys
results, work, rate, psgd_rank, psgd_start = sys.argv[1:]
runs = {}
for hook in ("allreduce", "powersgd"):
    lines = [json.loads(l) for l in open(f"{results}/powersgd_{hook}.jsonl") if l.strip()]
    epochs = [e for e in lines if "kind" not in e]  # not the step records
    later = [e["samples_per_sec"] for e in epochs[1:]] or [epochs[0]["samples_per_sec"]]
    mbytes = int(open(f"{work}/{hook}.bytes").read()) / 1e6
    runs[hook] = (statistics.median(later), epochs[-1]["test_accuracy"] * 100, mbytes, len(epochs))
print(f"link {rate}, 2 hosts x 1 rank, ddp_mnist batch 64 per rank; PowerSGD rank {psgd_rank} "
      f"after {psgd_start} plain steps; samples/s: median of epochs 2..N")
print(f"{'hook':<10} {'epochs':>6} {'samples/s':>10} {'test acc':>9} {'MB on h1':>9}")
for hook, (sps, acc, mb, n) in runs.items():
    print(f"{hook:<10} {n:>6} {sps:>10.1f} {acc:>8.2f}% {mb:>9.0f}")
speedup = runs["powersgd"][0] / runs["allreduce"][0]
gap = runs["allreduce"][1] - runs["powersgd"][1]
ok_speed, ok_acc = speedup >= 4.0, gap <= 1.0
print(f"PowerSGD / fp32 samples/s: {speedup:.2f}x (target >= 4x: {'met' if ok_speed else 'MISSED'})")
print(f"accuracy fp32 - PowerSGD: {gap:+.2f} points (target <= 1: {'met' if ok_acc else 'MISSED'})")
sys.exit(0 if ok_speed and ok_acc else 1)
EOF
/usr/bin/python3 "$root/scripts/plot_metrics.py" "$plot" \
  "$results/powersgd_allreduce.jsonl=fp32 all-reduce" \
  "$results/powersgd_powersgd.jsonl=PowerSGD rank $psgd_rank" \
  --title "ddp_mnist, 2 hosts x 1 rank over $rate"
exit $status

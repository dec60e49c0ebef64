#!/usr/bin/env bash
# Where the network is the limit (issue 42's table): ddp_mnist with its defaults against PyTorch
# DDP (gloo) on two emulated hosts (bench/emulated_hosts.sh's network namespaces), PER_HOST ranks
# each, joined by a link shaped to RATE; the seed CNN, Adadelta, batch 64 per rank. Rows: fp32,
# bf16 (ddp's --comm-hook bf16, torch's bf16_compress_hook) and PowerSGD of rank 4 from step 2
# (--comm-hook powersgd, torch's powerSGD_hook). Row powersgd1 (DDP_BENCH_ROWS): the same in one
# bucket on both sides, where torch's hook cannot issue its collectives out of order. With two ranks per host ddp takes its default
# (the hierarchical all-reduce, one leader per host), PyTorch gloo's ring. ddp and PyTorch
# alternate, ROUNDS times.
# ddp's figures: its median step in ddp_mnist's timeline (steps after the third, epoch boundaries
# left out), and ddp_mnist's own epoch line for its second epoch (30 steps, with the step after
# the first epoch's test); PyTorch's: the median of two windows of 10 steps after 2. A PyTorch run that fails is run again, up to 4
# times, and its failures are counted. The link floor: every rank's fp32 gradients (or its
# leader's, hierarchical) crossing the link once per step.
#   bench/slow_link.sh OUT_DIR [RATE (100mbit)] [PER_HOST (1)] [ROUNDS (2)]   needs root and a build
# RATE local: one host, no emulated link, PER_HOST ranks (the compute-bound rows).
# Writes OUT_DIR/slow_link.jsonl (one line per run) and prints one table. Several rates or
# layouts in one run ("100mbit 1gbit", "1 2"): one table each, from OUT_DIR/RATE-xPER_HOST.
# DDP_BENCH_TORCH_MALLOC=kept: PyTorch's ranks get the malloc setting ddp's Runtime makes
# (docs/performance.md) through GLIBC_TUNABLES, so the table compares the rest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
python=${DDP_PYTHON:-$root/.venv/bin/python}
out=$1 rate=${2:-100mbit} per_host=${3:-1} rounds=${4:-2}
if [ "$(wc -w <<< "$rate $per_host")" -gt 2 ]; then
  for r in $rate; do
    for p in $per_host; do "$0" "$out/$r-x$p" "$r" "$p" "$rounds"; done
  done
  exit 0
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)
jsonl=$out/slow_link.jsonl
: > "$jsonl"
# A run that hangs (PyTorch's PowerSGD can, after a collective mismatch) counts as failed.
if [ "$rate" = local ]; then
  ranks=$per_host
  launch() {
    timeout -k 10 "${DDP_BENCH_RUN_TIMEOUT:-300}" env "${ranks_env[@]}" \
      "$root/launch/ddprun" -n "$ranks" -t 1 "$@"
  }
else
  ranks=$((2 * per_host))
  . "$root/tests/cluster/netns_hosts.sh"
  netns_bench_hosts slow "$per_host"
  export work NETNS_ROOT && export -f netns_launch
  launch() {
    timeout -k 10 "${DDP_BENCH_RUN_TIMEOUT:-300}" env "${ranks_env[@]}" \
      bash -c 'netns_launch "$@"' _ "$ranks" "$per_host" "$@"
  }
  netns_shape h1 "$rate"
  netns_shape h2 "$rate"
fi
ranks_env=()
torch_malloc=()
if [ "${DDP_BENCH_TORCH_MALLOC:-}" = kept ]; then
  torch_malloc=(GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647)
fi

rows=(${DDP_BENCH_ROWS:-fp32 bf16 powersgd})  # DDP_BENCH_ROWS: some of them
for round in $(seq 1 "$rounds"); do
  for row in "${rows[@]}"; do
    ddp_hook=() torch_hook=()
    if [ "$row" = powersgd ]; then
      ddp_hook=(--comm-hook powersgd --powersgd-rank 4 --powersgd-start-iter 2)
      torch_hook=(--comm-hook powersgd --powersgd-rank 4 --powersgd-start-iter 2)
    elif [ "$row" = powersgd1 ]; then  # one 25 MiB bucket (no 1 MiB first one) on both sides
      ddp_hook=(--comm-hook powersgd --powersgd-rank 4 --powersgd-start-iter 2 --first-bucket-mb 25)
      torch_hook=(--comm-hook powersgd --powersgd-rank 4 --powersgd-start-iter 2 --bucket-cap-mb 25)
    elif [ "$row" = bf16 ]; then
      ddp_hook=(--comm-hook bf16) torch_hook=(--comm-hook bf16)
    fi
    metrics=$out/ddp_${row}_$round.jsonl
    rm -f "$metrics"
    launch "$build/examples/ddp_mnist" --epochs 2 --limit-train-batches 30 --batch-size 64 \
      --test-batch-size 1000 --log-interval 0 --progress none --metrics-file "$metrics" \
      --timeline "$out/ddp_${row}_$round.json" \
      "${ddp_hook[@]}" > "$out/ddp_${row}_$round.log" || true
    "$python" - "$metrics" "$out/ddp_${row}_$round.json" "$row" "$round" "$ranks" >> "$jsonl" <<'EOF'
import json, statistics, sys
path, timeline, row, rnd, ranks = sys.argv[1:]
try:
    epochs = [json.loads(l) for l in open(path) if l.strip() and '"kind"' not in l]
    epoch_sps = epochs[1]["samples_per_sec"]
    doc = json.load(open(timeline))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    starts = sorted(e["ts"] for e in events
                    if e.get("ph") == "X" and e["name"] == "backward" and e["pid"] == 0)
    periods = [b - a for a, b in zip(starts, starts[1:])][3:]
    typical = statistics.median(periods)
    period = statistics.median([p for p in periods if p < 3 * typical])  # not across a test
    sps = int(ranks) * 64 / (period / 1e6)
except (OSError, IndexError, KeyError, ValueError):
    sps = epoch_sps = None
print(json.dumps({"impl": "ddp", "row": row, "round": int(rnd), "samples_per_sec": sps,
                  "epoch_samples_per_sec": epoch_sps}))
EOF
    failures=0 sps=null ranks_env=("${torch_malloc[@]}")
    for attempt in 1 2 3 4 5; do
      rm -f "$out/torch.jsonl"
      if launch "$python" "$root/bench/pytorch_ddp.py" --model cnn --batch-size 64 \
           --warmup-steps 2 --window-steps 10 --windows 2 --optimizer adadelta \
           "${torch_hook[@]}" --out "$out/torch.jsonl" > "$out/torch_${row}_${round}_$attempt.log" &&
         [ -s "$out/torch.jsonl" ]; then
        sps=$("$python" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["samples_per_sec"])' "$out/torch.jsonl")
        break
      fi
      failures=$((failures + 1))
    done
    ranks_env=()
    echo "{\"impl\": \"pytorch\", \"row\": \"$row\", \"round\": $round, \"samples_per_sec\": $sps, \"failures\": $failures}" >> "$jsonl"
    tail -n 2 "$jsonl" | sed "s/^/  /"
  done
done

"$python" - "$jsonl" "$rate" "$per_host" "$root/bench" "${torch_malloc[*]}" <<'EOF'
import json, re, sys
path, rate, per_host, bench = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, bench)
import pytorch_ddp  # the same seed CNN, for its parameter count
params = sum(p.numel() for p in pytorch_ddp.MODELS["cnn"][0]().parameters())
m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", rate)
ranks = per_host if rate == "local" else 2 * per_host
floor = None
if m:
    bytes_per_s = float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8
    floor = ranks * 64 / (4 * params / bytes_per_s)
runs = [json.loads(l) for l in open(path)]
malloc = ", PyTorch with ddp's malloc setting" if len(sys.argv) > 5 and sys.argv[5] else ""
where = (f"one host, {per_host} rank(s)" if floor is None
         else f"link {rate}, 2 hosts x {per_host} rank(s)")
link = "" if floor is None else f"; fp32 link floor {floor:.1f} samples/s"
print(f"\n{where}, seed CNN, Adadelta, batch 64 per rank{malloc}; samples/s by round{link} "
      f"({4 * params / 1e6:.2f} MB of gradients per step)")
print(f"{'row':<9} {'ddp_mnist':>16} {'(epoch line)':>14} {'PyTorch DDP':>16} {'ratio':>12} "
      f"{'of floor':>10} {'PyTorch failures':>17}")
for row in dict.fromkeys(r["row"] for r in runs):
    ddp = [r["samples_per_sec"] for r in runs if r["row"] == row and r["impl"] == "ddp"]
    pt = [r["samples_per_sec"] for r in runs if r["row"] == row and r["impl"] == "pytorch"]
    fails = sum(r["failures"] for r in runs if r["row"] == row and r["impl"] == "pytorch")
    epoch = [r["epoch_samples_per_sec"] for r in runs if r["row"] == row and r["impl"] == "ddp"]
    fmt = lambda xs: "/".join("fail" if x is None else f"{x:.0f}" for x in xs)
    ratios = [f"{d / p:.2f}" if d and p else "-" for d, p in zip(ddp, pt)]
    of_floor = "/".join(f"{d / floor:.2f}" for d in ddp if d) if row == "fp32" and floor else ""
    print(f"{row:<9} {fmt(ddp):>16} {fmt(epoch):>14} {fmt(pt):>16} {'/'.join(ratios):>12} "
          f"{of_floor:>10} {fails:>10} of {sum(x is not None for x in pt) + fails}")
EOF

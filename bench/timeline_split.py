"""Median time per step of each phase, per rank, from ddp timelines (--timeline FILE).

    python bench/timeline_split.py TIMELINE.json...

One row per file and rank: the step's period (backward start to backward start), forward,
backward (its tail waits for the gradient all-reduce: "wait"), the optimizer, and "between":
from the optimizer's end to the next forward, less the data and zero_grad phases; in a Trainer
that is the step boundary (the stop agreement, snapshots) and reporting. Then each bucket's
all-reduce. The first 3 steps are left out (warm-up).
"""
import json
import statistics
import sys

SKIP = 3


def spans(path):
    doc = json.load(open(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X"]


def median_ms(values):
    values = values[SKIP:]
    return statistics.median(values) / 1000 if values else float("nan")


def rank_row(events):
    events = sorted(events, key=lambda e: e["ts"])
    named = lambda name: [e for e in events if e["name"] == name]
    backward, optimizer = named("backward"), named("optimizer")
    steps = len(backward)
    period = [backward[i + 1]["ts"] - backward[i]["ts"] for i in range(steps - 1)]
    forward, between = [], []
    for i in range(steps):
        start = backward[i - 1]["ts"] + backward[i - 1]["dur"] if i else 0
        forward.append(sum(e["dur"] for e in events
                           if e["name"] == "forward" and start <= e["ts"] <= backward[i]["ts"]))
    for i, opt in enumerate(optimizer[:-1]):
        end = opt["ts"] + opt["dur"]
        nxt = next((e for e in events if e["name"] == "forward" and e["ts"] >= end), None)
        if nxt is None:
            continue
        inside = sum(e["dur"] for e in events
                     if e["name"] in ("data", "zero_grad") and end <= e["ts"] < nxt["ts"])
        between.append(nxt["ts"] - end - inside)
    buckets = {}
    for e in events:
        if e["name"].startswith("all-reduce bucket"):
            buckets.setdefault(int(e["name"].split()[2]), []).append(e["dur"])
    return (median_ms(period), median_ms(forward), median_ms([e["dur"] for e in backward]),
            median_ms([e["dur"] for e in named("wait for gradient sync")]),
            median_ms([e["dur"] for e in optimizer]), median_ms(between),
            " ".join(f"{b}:{median_ms(d):.1f}" for b, d in sorted(buckets.items())))


def main(paths):
    print(f"{'timeline':<16} {'rank':>4} {'period':>7} {'forward':>7} {'backward':>8} "
          f"{'(wait)':>7} {'optim.':>7} {'between':>7}  all-reduce per bucket (ms)")
    for path in paths:
        events = spans(path)
        for rank in sorted({e["pid"] for e in events}):
            row = rank_row([e for e in events if e["pid"] == rank])
            name = path.rsplit("/", 1)[-1]
            print(f"{name:<16} {rank:>4} " + " ".join(f"{v:7.1f}" for v in row[:2]) +
                  f" {row[2]:8.1f} " + " ".join(f"{v:7.1f}" for v in row[3:6]) + f"  {row[6]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])

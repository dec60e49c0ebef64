"""Writes docs/records/performance.md (the records of a benchmark run) from the results (JSON lines)
and all-reduce tables; docs/performance.md is the hand-written guide and is not touched.

Usage: /usr/bin/python3 bench/report.py --results DIR --out docs/records/performance.md
DIR holds throughput.jsonl, emulated.jsonl (optional), allreduce_np*.txt, machine.txt and
commands.txt, as bench/run_all.sh leaves them.
"""
import argparse
import collections
import json
import os


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def throughput_table(rows, key_fields):
    """One row per (model, world[, link]): samples/s per impl and the ratios to PyTorch DDP."""
    impls = sorted({r["impl"] for r in rows}, key=lambda i: (i != "ddp-bucketed", i))
    groups = collections.OrderedDict()
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in key_fields), {})[r["impl"]] = r
    head = key_fields + [f"{i} (samples/s)" for i in impls]
    ours = [i for i in impls if i.startswith("ddp")]
    head += [f"{i} / pytorch-ddp" for i in ours]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, by_impl in groups.items():
        cells = [str(k) for k in key]
        cells += [f"{by_impl[i]['samples_per_sec']:.1f}" if i in by_impl else "–" for i in impls]
        ref = by_impl.get("pytorch-ddp")
        for i in ours:
            ok = ref and i in by_impl
            cells.append(f"**{by_impl[i]['samples_per_sec'] / ref['samples_per_sec']:.2f}x**" if ok else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def efficiency_table(rows):
    """Weak scaling: per-rank throughput at N ranks over that at 1 rank, per impl and model."""
    by = {(r["impl"], r["model"], r["world"]): r["samples_per_sec"] / r["world"] for r in rows}
    lines = ["| impl | model | 2 ranks | 4 ranks |", "|---|---|---|---|"]
    for impl, model in sorted({(r["impl"], r["model"]) for r in rows}):
        one = by.get((impl, model, 1))
        if not one:
            continue
        cells = [f"{100 * by[(impl, model, w)] / one:.0f}%" if (impl, model, w) in by else "–" for w in (2, 4)]
        lines.append(f"| {impl} | {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def before_after_table(before, after, key_fields):
    """Samples/s of one key (model, world or link) before and after, per impl, and after/before."""
    impls = ["ddp-bucketed", "ddp-per-parameter", "pytorch-ddp"]
    index = lambda rows: {tuple(r.get(k) for k in key_fields) + (r["impl"],): r["samples_per_sec"] for r in rows}
    b, a = index(before), index(after)
    keys = list(collections.OrderedDict.fromkeys(tuple(r.get(k) for k in key_fields) for r in after))
    head = key_fields + [f"{i}: before / after" for i in impls] + ["after: bucketed / per-param"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        cells = [str(k) for k in key]
        for i in impls:
            x, y = b.get(key + (i,)), a.get(key + (i,))
            cells.append(f"{x:.1f} / {y:.1f} ({y / x:.2f}x)" if x and y else (f"– / {y:.1f}" if y else "–"))
        bucketed, per_param = a.get(key + ("ddp-bucketed",)), a.get(key + ("ddp-per-parameter",))
        cells.append(f"{bucketed / per_param:.2f}x" if bucketed and per_param else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read(path):
    return open(path).read().strip() if os.path.exists(path) else "(not run)"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--before", help="results of the same benchmarks from an earlier build, compared in a table")
    parser.add_argument("--before-label", default="an earlier build", help="what --before was built from")
    args = parser.parse_args()
    d = args.results
    local = load(os.path.join(d, "throughput.jsonl"))
    emulated = load(os.path.join(d, "emulated.jsonl"))
    parts = [
        "# Performance",
        "",
        "Written by `bench/run_all.sh` (do not edit by hand); the commands are at the end.",
        "",
        "## Machine",
        "",
        "```",
        read(os.path.join(d, "machine.txt")),
        "```",
        "",
        "## Training throughput, one host",
        "",
        "Samples/s over all ranks (median of the timed windows after warm-up), synthetic data, "
        "SGD with momentum, `OMP_NUM_THREADS=1` per rank. The machine has 2 cores: **4 ranks "
        "oversubscribe it** (2 ranks per core), so 4-rank numbers measure contention more than "
        "scaling. Batch per rank: mlp 64, cnn 64, resnet18 16.",
        "",
        throughput_table(local, ["model", "world"]) if local else "(not run)",
        "",
        "Weak-scaling efficiency (per-rank samples/s at N ranks / at 1 rank):",
        "",
        efficiency_table(local) if local else "(not run)",
        "",
        "![cnn](../img/throughput_cnn.png) ![resnet18](../img/throughput_resnet18.png) ![mlp](../img/throughput_mlp.png)",
        "",
        "## Two emulated hosts",
        "",
        "2 ranks, one per network namespace, joined by veths shaped with `tc tbf`; Open MPI "
        "over TCP on that link only (see docs/launching.md for the emulated hosts). ddp's "
        "all-reduces of 64 KiB or more cross it on ddp's socket ring (`DDP_MPI_SOCKETS=auto`: "
        "two hosts, no InfiniBand), the rest on MPI; PyTorch DDP uses gloo.",
        "",
        throughput_table(emulated, ["model", "link"]) if emulated else "(not run)",
        "",
        "![emulated](../img/throughput_emulated.png)" if emulated else "",
        "",
        "## All-reduce bandwidth (nccl-tests style)",
        "",
    ]
    for name in sorted(os.listdir(d)):
        if name.startswith("allreduce_") and name.endswith(".txt"):
            parts += [f"`{name[:-4]}`:", "", "```", read(os.path.join(d, name)), "```", ""]
    if args.before:
        before_local = load(os.path.join(args.before, "throughput.jsonl"))
        before_emulated = load(os.path.join(args.before, "emulated.jsonl"))
        parts += [
            "## Before and after",
            "",
            f"The same benchmarks, run back to back on this machine: before = {args.before_label}, "
            "after = the build above. Samples/s, before / after (after/before).",
            "",
            "```",
            read(os.path.join(args.before, "machine.txt")),
            "```",
            "",
            "One host:",
            "",
            before_after_table(before_local, local, ["model", "world"]),
            "",
            "Two emulated hosts:",
            "",
            before_after_table(before_emulated, emulated, ["model", "link"]) if emulated else "(not run)",
            "",
        ]
    parts += ["The reading of these figures: [bench/analysis.md](../../bench/analysis.md).", ""]
    parts += [
        "## Timeline of a 2-rank step",
        "",
        "![timeline](../img/timeline_cnn_2ranks.png)",
        "",
        "## Commands",
        "",
        "```",
        read(os.path.join(d, "commands.txt")),
        "```",
        "",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(parts))
    print("wrote", args.out)


if __name__ == "__main__":
    main()

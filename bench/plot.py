#!/usr/bin/python3
"""Bar charts of benchmark results (JSONL from bench/pytorch_ddp.py and the C++ benchmarks).

    /usr/bin/python3 bench/plot.py --out-dir docs/img results1.jsonl [results2.jsonl ...]

Each line is one result: {"impl", "model", "world", "batch", "threads", "samples_per_sec",
"windows", ...}, plus "link" (e.g. "1gbit") for runs between emulated hosts. Writes
  throughput_<model>.png       same-host runs: x = world size, one bar per impl
  throughput_emulated.png      emulated-host runs: one panel per model, x = link (and world)
Bars show the median window; the whiskers span the slowest to the fastest window.
When the same configuration appears more than once, the last line read wins.
Needs only matplotlib, not torch.
"""

import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt  # noqa: E402  (must come after the backend is chosen)

REQUIRED = ("impl", "model", "world", "samples_per_sec")


def read_results(paths):
    """All result lines, in file and line order. Exits with file:line on a malformed one."""
    results = []
    for path in paths:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    missing = [k for k in REQUIRED if k not in r]
                    if missing:
                        raise ValueError("missing " + ", ".join(missing))
                except ValueError as e:
                    sys.exit(f"{path}:{number}: not a result line: {e}")
                results.append(r)
    return results


def link_rate(link):
    """Bits per second of a link name like "100mbit" or "1gbit", for ordering; None if unknown."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", link.lower())
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def link_order(link):
    rate = link_rate(link)
    return (rate is None, rate or 0, link)  # known rates ascending, then the rest by name


def describe(results, key, unit):
    """e.g. "batch 64" or "batch 32/64" over the given results; "" when no result has the key."""
    values = sorted({r[key] for r in results if key in r})
    return f"{unit} {'/'.join(str(v) for v in values)}" if values else ""


def short(value):
    """A bar label: 3 significant digits, thousands as "k" (12.9k, not 1.29e+04)."""
    return f"{value / 1000:.3g}k" if value >= 1000 else f"{value:.3g}"


def latest(results, key_of):
    """key -> the last result with that key, warning about each one replaced."""
    table = {}
    for r in results:
        k = key_of(r)
        if k in table:
            print(f"note: {r['model']} {k} appears more than once; using the last one",
                  file=sys.stderr)
        table[k] = r
    return table


def grouped_bars(ax, categories, impls, table, colors):
    """One group of bars per category, one bar per impl; table maps (category, impl) -> result."""
    width = min(0.8 / len(impls), 0.3)  # a lone bar should not fill the whole axis
    first = -width * (len(impls) - 1) / 2  # offset of the first bar from the group's center
    for i, impl in enumerate(impls):
        xs, heights, low, high = [], [], [], []
        for c, category in enumerate(categories):
            r = table.get((category, impl))
            if r is None:
                continue  # this impl was not run here: leave a gap
            y = r["samples_per_sec"]
            windows = r.get("windows") or [y]
            xs.append(c + first + width * i)
            heights.append(y)
            low.append(max(0.0, y - min(windows)))
            high.append(max(0.0, max(windows) - y))
        if not xs:
            continue
        bars = ax.bar(xs, heights, width, yerr=[low, high], capsize=2, label=impl,
                      color=colors[impl], error_kw={"elinewidth": 0.8, "ecolor": "0.3"})
        ax.bar_label(bars, labels=[short(h) for h in heights], fontsize=7, padding=2)
    ax.set_xticks(range(len(categories)))
    ax.set_xlim(-0.5, len(categories) - 0.5)
    ax.set_ylabel("samples/s (all ranks)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.margins(y=0.12)  # room for the value labels above the tallest bar


def plot_same_host(results, impls, colors, out_dir):
    paths = []
    for model in sorted({r["model"] for r in results}):
        mine = [r for r in results if r["model"] == model]
        worlds = sorted({r["world"] for r in mine})
        table = latest(mine, lambda r: (r["world"], r["impl"]))
        present = [i for i in impls if any(k[1] == i for k in table)]
        fig, ax = plt.subplots(figsize=(max(6, 2 + 0.4 * len(worlds) * len(present)), 4.5))
        grouped_bars(ax, worlds, present, table, colors)
        ax.set_xticklabels([str(w) for w in worlds])
        ax.set_xlabel("ranks on one host")
        details = ", ".join(d for d in (describe(mine, "batch", "batch"),
                                        describe(mine, "threads", "threads")) if d)
        ax.set_title(f"{model}: training throughput on one host"
                     + (f"\n{details} per rank" if details else ""), fontsize=11)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"throughput_{model}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_emulated(results, impls, colors, out_dir):
    models = sorted({r["model"] for r in results})
    # One panel per model: throughput differs by orders of magnitude between models.
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in results if r["model"] == model]
        categories = sorted({(r["link"], r["world"]) for r in mine},
                            key=lambda c: (link_order(c[0]), c[1]))
        table = latest(mine, lambda r: ((r["link"], r["world"]), r["impl"]))
        present = [i for i in impls if any(k[1] == i for k in table)]
        grouped_bars(ax, categories, present, table, colors)
        ax.set_xticklabels([f"{link}\n{world} ranks" for link, world in categories])
        details = ", ".join(d for d in (describe(mine, "batch", "batch"),
                                        describe(mine, "threads", "threads")) if d)
        ax.set_title(model + (f" ({details} per rank)" if details else ""), fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("Training throughput between emulated hosts, by link")
    fig.tight_layout()
    path = os.path.join(out_dir, "throughput_emulated.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main():
    p = argparse.ArgumentParser(description="Bar charts of benchmark JSONL results.")
    p.add_argument("--out-dir", required=True, help="directory for the PNG files")
    p.add_argument("results", nargs="+", help="JSONL result files")
    args = p.parse_args()

    results = read_results(args.results)
    if not results:
        sys.exit("no results in " + " ".join(args.results))
    # One color per impl, the same in every figure, in order of first appearance.
    impls = list(dict.fromkeys(r["impl"] for r in results))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {impl: cycle[i % len(cycle)] for i, impl in enumerate(impls)}

    os.makedirs(args.out_dir, exist_ok=True)
    same_host = [r for r in results if "link" not in r]
    emulated = [r for r in results if "link" in r]
    paths = []
    if same_host:
        paths += plot_same_host(same_host, impls, colors, args.out_dir)
    if emulated:
        paths += plot_emulated(emulated, impls, colors, args.out_dir)
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()

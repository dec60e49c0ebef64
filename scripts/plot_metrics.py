#!/usr/bin/python3
"""Draw training curves from ddp metrics files (--metrics-file: one JSON object per epoch).

    /usr/bin/python3 scripts/plot_metrics.py OUT.png METRICS.jsonl[=LABEL] [...] [--title T]

Three panels, epoch on the x axis: train and test loss, test accuracy, and throughput
(samples/s over all ranks). Several files are overlaid, one colour each, labelled with LABEL or
else the file's name, e.g. runs at 1, 2 and 4 ranks:

    plot_metrics.py curves.png ranks1.jsonl=1\\ rank ranks2.jsonl=2\\ ranks

Needs only matplotlib (Debian's python3-matplotlib).
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt  # noqa: E402  (must come after the backend is chosen)

FIELDS = ("epoch", "train_loss", "test_loss", "test_accuracy", "samples_per_sec")


def read_metrics(path):
    """The epochs of one metrics file, in file order; exits naming the file and line at fault."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit(f"plot_metrics: {path}: {e.strerror}")
    epochs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"plot_metrics: {path}:{number}: not JSON ({e.msg})")
        missing = [k for k in FIELDS if k not in record]
        if missing:
            sys.exit(f"plot_metrics: {path}:{number}: no {', '.join(missing)}")
        epochs.append(record)
    if not epochs:
        sys.exit(f"plot_metrics: {path}: no epochs")
    return epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("runs", nargs="+", help="METRICS.jsonl or METRICS.jsonl=LABEL")
    parser.add_argument("--title", default="ddp training")
    args = parser.parse_args()

    fig, (ax_loss, ax_acc, ax_rate) = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(args.runs):
        path, _, label = run.partition("=")
        label = label or os.path.basename(path)
        epochs = read_metrics(path)
        colour = colours[i % len(colours)]
        x = [e["epoch"] for e in epochs]
        ax_loss.plot(x, [e["train_loss"] for e in epochs], "o-", color=colour,
                     label=f"{label}: train")
        ax_loss.plot(x, [e["test_loss"] for e in epochs], "s--", color=colour,
                     label=f"{label}: test")
        ax_acc.plot(x, [100 * e["test_accuracy"] for e in epochs], "o-", color=colour, label=label)
        ax_rate.plot(x, [e["samples_per_sec"] for e in epochs], "o-", color=colour, label=label)

    for ax, ylabel in ((ax_loss, "loss"), (ax_acc, "test accuracy (%)"),
                       (ax_rate, "samples/s (all ranks)")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    ax_rate.set_ylim(bottom=0)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot_metrics: wrote {args.out} ({len(args.runs)} run(s))")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Draw training curves from ddp metrics files (--metrics-file: a JSON object per epoch, and a
step record every --log-interval batches).

    /usr/bin/python3 scripts/plot_metrics.py OUT.png METRICS.jsonl[=LABEL] [...] [--title T]

Three panels, epoch on the x axis: train and test loss, test accuracy, and throughput
(samples/s over all ranks); and a fourth, the loss per step (the step records' loss, averaged
over the ranks, against the optimizer step) when a file has step records. Several files are
overlaid, one colour each, labelled with LABEL or else the file's name, e.g. runs at 1, 2 and 4
ranks:

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
    """The epoch lines and the step records of one metrics file, each in file order; exits
    naming the file and line at fault."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit(f"plot_metrics: {path}: {e.strerror}")
    epochs, steps = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"plot_metrics: {path}:{number}: not JSON ({e.msg})")
        if not isinstance(record, dict):
            sys.exit(f"plot_metrics: {path}:{number}: not a JSON object")
        if record.get("kind") == "step":
            if "step" not in record or "loss" not in record:
                sys.exit(f"plot_metrics: {path}:{number}: a step record without step or loss")
            steps.append(record)
            continue
        missing = [k for k in FIELDS if k not in record]
        if missing:
            sys.exit(f"plot_metrics: {path}:{number}: no {', '.join(missing)}")
        epochs.append(record)
    if not epochs:
        sys.exit(f"plot_metrics: {path}: no epochs")
    return epochs, steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("runs", nargs="+", help="METRICS.jsonl or METRICS.jsonl=LABEL")
    parser.add_argument("--title", default="ddp training")
    args = parser.parse_args()

    runs = []
    for run in args.runs:
        path, _, label = run.partition("=")
        runs.append((label or os.path.basename(path), *read_metrics(path)))
    with_steps = any(steps for _, _, steps in runs)
    fig, axes = plt.subplots(1, 4 if with_steps else 3, figsize=(20 if with_steps else 15, 4.2))
    ax_loss, ax_acc, ax_rate = axes[:3]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, epochs, steps) in enumerate(runs):
        colour = colours[i % len(colours)]
        if steps:
            axes[3].plot([s["step"] for s in steps], [s["loss"] for s in steps], "-", color=colour,
                         label=label)
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
    if with_steps:
        axes[3].set_xlabel("step")
        axes[3].set_ylabel("loss (step records)")
        axes[3].grid(True, alpha=0.3)
        axes[3].legend(fontsize=8)
    ax_rate.set_ylim(bottom=0)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot_metrics: wrote {args.out} ({len(args.runs)} run(s))")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Render a ddp timeline (Chrome-trace JSON from --timeline) as a Gantt-style PNG.

    /usr/bin/python3 scripts/timeline_png.py TRACE.json OUT.png [--title T] \
        [--start-ms A --end-ms B]

One row per (rank, thread): the training thread (tid 0) and, with bucketed gradient sync, the
communication thread (tid 1). Spans are colored by phase; spans nested in another one (the
gradient-sync wait, or per-parameter all-reduces, inside backward) are drawn thinner on top of
it. Ticks mark when a bucket was queued for all-reduce. The x axis is trace time in ms; by
default it shows the last 3 training steps (from rank 0's third-last "forward" to the end,
plus 1% on either side).
Needs only matplotlib.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt  # noqa: E402  (must come after the backend is chosen)
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

# Phase -> color, in legend order. Training phases are span names; see phase_of for the rest.
COLORS = {
    "data": "#9e9e9e",
    "zero_grad": "#c5b0d5",
    "forward": "#1f77b4",
    "backward": "#ff7f0e",
    "all-reduce": "#2ca02c",
    "wait": "#d62728",
    "optimizer": "#9467bd",
    "other": "#bcbd22",
}
STEPS_SHOWN = 3


def phase_of(name):
    if name.startswith("all-reduce"):
        return "all-reduce"
    if name.startswith("wait"):
        return "wait"
    return name if name in COLORS else "other"


def short_label(name):
    """Text written inside a wide enough span: "bucket 3" for "all-reduce bucket 3 (96 KiB)"."""
    if name.startswith("all-reduce "):
        return name[len("all-reduce "):].split(" (")[0]
    return "wait" if name.startswith("wait") else name


def load(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    spans = [e for e in events if e.get("ph") == "X"]
    queued = [e for e in events if e.get("ph") == "i" and e["name"].startswith("queue bucket")]
    names = {}  # (pid, tid) or (pid, None) -> name from the metadata events
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            tid = e.get("tid") if e["name"] == "thread_name" else None
            names[(e["pid"], tid)] = e.get("args", {}).get("name", "")
    return spans, queued, names


def default_window(spans):
    """(start, end) in µs: rank 0's third-last "forward" to the end of the last span after it,
    or the whole trace when rank 0 has fewer forwards."""
    forwards = sorted(e["ts"] for e in spans
                      if e["pid"] == 0 and e.get("tid", 0) == 0 and e["name"] == "forward")
    start = forwards[-STEPS_SHOWN] if len(forwards) >= STEPS_SHOWN else \
        min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans if e["ts"] >= start)
    margin = 0.01 * (end - start)
    return start - margin, end + margin


def nesting_depths(row_spans):
    """Depth of each span within its row: 0 for outermost, 1 inside another span, ..."""
    depths, open_ends = [], []  # open_ends: ends of the spans enclosing the current one
    for e in row_spans:  # sorted by start, longer first on ties
        # ts and dur are each rounded to 0.001 µs, so back-to-back spans can seem to overlap
        # by a rounding step: that must not count as nesting.
        open_ends = [t for t in open_ends if t > e["ts"] + 0.01]
        depths.append(len(open_ends))
        open_ends.append(e["ts"] + e["dur"])
    return depths


def main():
    p = argparse.ArgumentParser(description="Render a ddp Chrome-trace timeline as a PNG.")
    p.add_argument("trace", help="Chrome-trace JSON written by the framework")
    p.add_argument("out", help="PNG to write")
    p.add_argument("--title", help="figure title (default: the trace's file name)")
    p.add_argument("--start-ms", type=float, help="left edge, trace time in ms")
    p.add_argument("--end-ms", type=float, help="right edge, trace time in ms")
    args = p.parse_args()

    spans, queued, names = load(args.trace)
    if not spans:
        sys.exit(f"{args.trace}: no complete (\"ph\": \"X\") events")
    start, end = default_window(spans)
    if args.start_ms is not None:
        start = args.start_ms * 1000
    if args.end_ms is not None:
        end = args.end_ms * 1000
    if end <= start:
        sys.exit(f"empty window: {start / 1000:.3f} ms to {end / 1000:.3f} ms")

    # Rows for every (rank, thread) with spans anywhere in the trace, so that a thread idle in
    # the window still shows up; rank 0's training thread on top.
    rows = sorted({(e["pid"], e.get("tid", 0)) for e in spans})
    row_of = {key: i for i, key in enumerate(rows)}

    fig, ax = plt.subplots(figsize=(12, 0.55 * len(rows) + 1.8))
    shown = set()
    labels = []  # (text artist, row, depth, left ms, right ms) of each span's visible part
    bars = []  # (row, depth, left ms, right ms) of every span drawn
    for key in rows:
        row_spans = sorted((e for e in spans if (e["pid"], e.get("tid", 0)) == key),
                           key=lambda e: (e["ts"], -e["dur"]))
        for e, depth in zip(row_spans, nesting_depths(row_spans)):
            if e["ts"] + e["dur"] < start or e["ts"] > end:
                continue
            phase = phase_of(e["name"])
            shown.add(phase)
            height = 0.8 * 0.65 ** depth
            y = row_of[key]
            ax.broken_barh([(e["ts"] / 1000, e["dur"] / 1000)], (y - height / 2, height),
                           facecolors=COLORS[phase], edgecolor="white", linewidth=0.3,
                           zorder=2 + depth)
            left, right = max(e["ts"], start) / 1000, min(e["ts"] + e["dur"], end) / 1000
            bars.append((y, depth, left, right))
            if right - left < 0.02 * (end - start) / 1000:
                continue  # far too narrow for a label; spares text artists on long windows
            text = ax.text((left + right) / 2, y, short_label(e["name"]), ha="center",
                           va="center", fontsize=7, color="white", zorder=10)
            labels.append((text, y, depth, left, right))

    queued = [e for e in queued
              if start <= e["ts"] <= end and (e["pid"], e.get("tid", 0)) in row_of]
    if queued:
        ax.scatter([e["ts"] / 1000 for e in queued],
                   [row_of[(e["pid"], e.get("tid", 0))] - 0.45 for e in queued],
                   marker="v", s=14, color="black", zorder=11)

    def row_label(pid, tid):
        rank = names.get((pid, None)) or f"rank {pid}"
        thread = names.get((pid, tid)) or f"thread {tid}"
        return f"{rank}: {thread}"

    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([row_label(*key) for key in rows])
    ax.set_ylim(len(rows) - 0.4, -0.6)  # first row at the top
    ax.set_xlim(start / 1000, end / 1000)
    ax.set_xlabel("time since the timeline started (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(args.title or os.path.basename(args.trace))

    handles = [Patch(color=COLORS[ph], label=ph) for ph in COLORS if ph in shown]
    if queued:
        handles.append(Line2D([], [], marker="v", linestyle="", color="black",
                              label="bucket queued"))
    fig.tight_layout()
    # Now that the layout is final, keep a span's label only where it fits inside the span and
    # no span nested in it is drawn over the text.
    renderer = fig.canvas.get_renderer()
    to_ms = ax.transData.inverted()
    for text, y, depth, left, right in labels:
        box = text.get_window_extent(renderer)
        x0, x1 = to_ms.transform((box.x0 - 2, 0))[0], to_ms.transform((box.x1 + 2, 0))[0]
        covered = any(row == y and d > depth and l < x1 and r > x0 for row, d, l, r in bars)
        if x0 < left or x1 > right or covered:
            text.remove()
    # Just below the figure; bbox_inches="tight" grows the image to take it in.
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=len(handles), fontsize=8, frameon=False)
    fig.savefig(args.out, dpi=130, bbox_inches="tight")
    print(args.out)


if __name__ == "__main__":
    main()

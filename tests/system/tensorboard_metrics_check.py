#!/usr/bin/env python3
"""Checks that a --tensorboard folder holds what the --metrics-file holds (issue 41).

    tensorboard_metrics_check.py METRICS.jsonl EVENTS_DIR [--steps 1,3,5] [--epochs 2]
                                 [--hparam NAME=VALUE ...]

Read with TensorBoard's own reader (EventAccumulator, after its purge of the steps a resumed run
trained again): every number of every step record is the scalar "step/<key>" at the record's
step, and every number of every epoch line the scalar "epoch/<key>" at the epoch, equal as
float32 (TensorBoard keeps float32); each tag has exactly those steps, once each; no other
scalar tag. --steps and --epochs: the steps of the step records and the number of epoch lines
the metrics file must have, each once. --hparam: a value the hparams plugin's session start
info must have (a number, or else a string or true/false). Exits non-zero naming the first
difference.
"""

import argparse
import json
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2

NOT_SCALARS = {"kind", "epoch", "batch", "step"}


def float32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def fail(message):
    sys.exit(f"FAIL: {message}")


def expected_scalars(path):
    """{tag: {step: value}} from the metrics file, and its step records' steps and epochs."""
    expected, steps, epochs = {}, [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            record = json.loads(line)
            if record.get("kind") == "step":
                prefix, at = "step/", record["step"]
                steps.append(at)
            elif "kind" not in record:
                prefix, at = "epoch/", record["epoch"]
                epochs.append(at)
            else:
                fail(f"{path}:{number}: unknown kind {record['kind']!r}")
            for key, value in record.items():
                if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                values = expected.setdefault(prefix + key, {})
                if at in values:
                    fail(f"{path}:{number}: {prefix + key} at {at} twice")
                values[at] = value
    return expected, steps, epochs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("metrics")
    parser.add_argument("events")
    parser.add_argument("--steps", default="")
    parser.add_argument("--epochs", type=int, default=0)
    parser.add_argument("--hparam", action="append", default=[])
    args = parser.parse_args()

    expected, steps, epochs = expected_scalars(args.metrics)
    if args.steps and steps != [int(s) for s in args.steps.split(",")]:
        fail(f"the step records' steps are {steps}, expected {args.steps}")
    if args.epochs and epochs != list(range(1, args.epochs + 1)):
        fail(f"the epoch lines' epochs are {epochs}, expected 1..{args.epochs}")
    for tag in ("step/loss", "step/lr", "step/samples_per_sec", "step/data_share",
                "epoch/train_loss", "epoch/test_loss"):
        if tag not in expected:
            fail(f"the metrics file has no {tag[tag.index('/') + 1:]} ({tag})")

    events = event_accumulator.EventAccumulator(
        args.events, size_guidance={event_accumulator.SCALARS: 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    if tags != set(expected):
        fail(f"TensorBoard's scalar tags differ: only in TensorBoard {sorted(tags - set(expected))}, "
             f"only in the metrics file {sorted(set(expected) - tags)}")
    compared = 0
    for tag, values in sorted(expected.items()):
        scalars = events.Scalars(tag)
        got_steps = [s.step for s in scalars]
        if got_steps != sorted(values):
            fail(f"{tag}: TensorBoard has steps {got_steps}, the metrics file {sorted(values)}")
        for s in scalars:
            if s.value != float32(values[s.step]):
                fail(f"{tag} at {s.step}: TensorBoard {s.value!r}, the metrics file "
                     f"{values[s.step]!r} (float32 {float32(values[s.step])!r})")
            compared += 1

    content = events.PluginTagToContent("hparams").get("_hparams_/session_start_info")
    if content is None and args.hparam:
        fail("no hparams (_hparams_/session_start_info) in the event files")
    if args.hparam:
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        hparams = data.session_start_info.hparams
        for item in args.hparam:
            name, _, text = item.partition("=")
            if name not in hparams:
                fail(f"hparams: no {name} among {sorted(hparams)}")
            value = hparams[name]
            kind = value.WhichOneof("kind")
            got = {"number_value": value.number_value, "string_value": value.string_value,
                   "bool_value": value.bool_value}.get(kind)
            want = {"true": True, "false": False}.get(text, text)
            if kind == "number_value":
                want = float(text)
            if got != want:
                fail(f"hparams: {name} is {got!r} ({kind}), expected {want!r}")
    print(f"tensorboard_metrics_check: {compared} scalars in {len(tags)} tags equal the metrics "
          f"file's ({len(steps)} step records, {len(epochs)} epoch lines)"
          + (f"; hparams {', '.join(args.hparam)}" if args.hparam else ""))


if __name__ == "__main__":
    main()

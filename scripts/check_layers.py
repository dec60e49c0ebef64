#!/usr/bin/env python3
"""Checks that the library's layers include only what is below them (docs/architecture.md).

The folders under framework/include/ddp/ and framework/src/ are the layers. A file in layer L may
include the headers of L and of the layers L builds on, <ddp/config.h>, and nothing else of ddp
(<ddp/ddp.h> is for programs). Public headers are included as <ddp/L/name.h>, internal ones as
"L/name.h". Exit status 1 and one line per violation (file:line: what) when the rule is broken.
"""
import pathlib
import re
import sys

# What each layer may include, besides itself. runtime and comm are siblings: the backends know
# nothing of the Runtime; parallel (ProcessGroup) builds them from it.
ALLOWED = {
    "util": set(),
    "runtime": {"util"},
    "comm": {"util"},
    "parallel": {"util", "runtime", "comm"},
    "data": {"util"},
    "optim": {"util", "comm"},  # GradScaler agrees on overflow over a Communicator
    "nn": {"util", "comm"},
    "train": {"util", "runtime", "comm", "parallel", "data", "optim", "nn"},
    # ddp::cli, a library of its own on top (start-up helper, training flags): every layer.
    "cli": {"util", "runtime", "comm", "parallel", "data", "optim", "nn", "train"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of_include(bracket, path):
    """The layer an include names, '' for <ddp/config.h>, None when it is not ddp's."""
    parts = path.split("/")
    if bracket == "<":
        if parts[0] != "ddp":
            return None
        if path in ("ddp/config.h",):
            return ""
        return parts[1] if len(parts) == 3 else "ddp.h" if path == "ddp/ddp.h" else "?"
    return parts[0] if len(parts) == 2 and parts[0] in ALLOWED else "?"


def main(root):
    framework = pathlib.Path(root) / "framework"
    problems = []
    files = []
    for base in (framework / "include" / "ddp", framework / "src"):
        for path in sorted(base.rglob("*")):
            if path.is_dir() or path.suffix not in (".h", ".cpp", ".in"):
                continue
            relative = path.relative_to(base)
            if len(relative.parts) == 1:
                if path.name not in ("ddp.h", "config.h.in"):
                    problems.append(f"{path}: outside every layer folder ({', '.join(ALLOWED)})")
                continue
            layer = relative.parts[0]
            if layer not in ALLOWED or len(relative.parts) != 2:
                problems.append(f"{path}: '{relative.parent}' is not a layer ({', '.join(ALLOWED)})")
                continue
            files.append((path, layer))
    for path, layer in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = layer_of_include(match.group(1), match.group(2))
            if target is None or target == "" or target == layer or target in ALLOWED[layer]:
                continue
            what = match.group(2)
            if target == "?":
                problems.append(f"{path}:{number}: {what} is not a ddp header of any layer")
            else:
                problems.append(f"{path}:{number}: layer '{layer}' includes {what} "
                                f"(layer '{target}'); it may include only "
                                f"{', '.join(sorted(ALLOWED[layer] | {layer}))}")
    for problem in problems:
        print(problem)
    print(f"check_layers: {len(files)} files in {len(ALLOWED)} layers, "
          f"{len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent))

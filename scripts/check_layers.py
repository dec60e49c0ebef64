#!/usr/bin/env python3
"""Checks the library's layers and its public surface (docs/architecture.md).

Source tree (check_layers.py ROOT): the folders under framework/src/ are the layers. A file in
layer L may include the headers of L and of the layers L builds on, <ddp/config.h>, and nothing
else of ddp (<ddp/ddp.h> and <ddp/train/train.h> are for programs). The core's public headers
(framework/include/ddp/*.h) belong to the layers PUBLIC_CORE names; the training kit's
(include/ddp/train/) to 'train', ddp::cli's (include/ddp/cli/) to 'cli'. The core's internal
headers are included as "L/name.h", or "L/ROOM/name.h" from a layer's sub-folder (one level: comm/
has one per backend and one for the communicators built of others). The kit and ddp::cli are built like a user's code on top of
the core: of the core they include the public headers, and of its internals only util/'s
header-only helpers.

Installed package (check_layers.py ROOT --installed PREFIX): what `cmake --install` put in
PREFIX/include/ddp is the public API: every header includes only installed ddp headers; none
includes MPI, NCCL, the CUDA runtime, a thread or a mutex header; the core has at most
CORE_BUDGET headers; <ddp/ddp.h> reaches the core's headers alone.

Exit status 1 and one line per violation (file:line: what) when a rule is broken.
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
    "nn": {"util", "comm"},
    # ddp::train, the training kit, on top of the core.
    "train": {"util", "runtime", "comm", "parallel", "data", "nn"},
    # ddp::cli, a library of its own on top (start-up helper, training flags).
    "cli": {"util", "runtime", "comm", "parallel", "data", "nn", "train"},
}
CORE = {"util", "runtime", "comm", "parallel", "data", "nn"}
# Layers that see the core as a user does: its public headers, and util/'s internal helpers.
ON_TOP = {"train", "cli"}
# The core's public headers and their layers.
PUBLIC_CORE = {
    "checkpoint_file.h": "util",
    "stop_signal.h": "util",
    "runtime.h": "runtime",
    "communicator.h": "comm",
    "process_group.h": "parallel",
    "distributed_data_parallel.h": "parallel",
    "comm_hook.h": "parallel",
    "zero_redundancy_optimizer.h": "parallel",
    "timeline.h": "parallel",
    "distributed_sampler.h": "data",
    "sync_batch_norm.h": "nn",
}
UMBRELLAS = {"ddp/ddp.h", "ddp/train/train.h"}
CORE_BUDGET = 13  # public core headers, config.h and ddp.h included (issue 24: "about 12"; issue 29 added comm_hook.h and zero_redundancy_optimizer.h; replicas.h went)
FORBIDDEN_IN_PUBLIC = {
    "mpi.h": "MPI", "nccl.h": "NCCL", "cuda_runtime.h": "the CUDA runtime",
    "cuda_runtime_api.h": "the CUDA runtime", "cuda.h": "the CUDA driver API",
    "thread": "a thread", "mutex": "a mutex", "shared_mutex": "a mutex",
    "condition_variable": "a condition variable",
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of_include(bracket, path):
    """(layer, public) an include names; layer '' for <ddp/config.h>, None when not ddp's."""
    parts = path.split("/")
    if bracket == "<":
        if parts[0] != "ddp":
            return None, True
        if path == "ddp/config.h":
            return "", True
        if path in UMBRELLAS:
            return "umbrella", True
        if len(parts) == 2:
            return PUBLIC_CORE.get(parts[1], "?"), True
        if len(parts) == 3 and parts[1] in ("train", "cli"):
            return parts[1], True
        return "?", True
    return (parts[0] if len(parts) in (2, 3) and parts[0] in ALLOWED else "?"), False


def source_files(framework, problems):
    """(path, layer) of every header and source of the library."""
    files = []
    include = framework / "include" / "ddp"
    for path in sorted(include.rglob("*")):
        if path.is_dir() or path.suffix not in (".h", ".in"):
            continue
        relative = path.relative_to(include)
        if len(relative.parts) == 1:
            if path.name in ("ddp.h", "config.h.in"):
                continue
            if path.name not in PUBLIC_CORE:
                problems.append(f"{path}: a public core header that PUBLIC_CORE does not name")
                continue
            files.append((path, PUBLIC_CORE[path.name]))
        elif len(relative.parts) == 2 and relative.parts[0] in ON_TOP:
            if path.name != "train.h":
                files.append((path, relative.parts[0]))
        else:
            problems.append(f"{path}: not a public header of the core, the kit or ddp::cli")
    src = framework / "src"
    for path in sorted(src.rglob("*")):
        if path.is_dir() or path.suffix not in (".h", ".cpp"):
            continue
        relative = path.relative_to(src)
        layer = relative.parts[0]
        if layer not in ALLOWED or len(relative.parts) not in (2, 3):
            problems.append(f"{path}: '{relative.parent}' is not a layer ({', '.join(ALLOWED)})")
            continue
        files.append((path, layer))
    return files


def check_sources(root):
    framework = pathlib.Path(root) / "framework"
    problems = []
    files = source_files(framework, problems)
    for path, layer in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target, public = layer_of_include(match.group(1), match.group(2))
            what = match.group(2)
            if target is None or target == "" or target == layer:
                continue
            if target == "?":
                problems.append(f"{path}:{number}: {what} is not a ddp header of any layer")
            elif target == "umbrella":
                problems.append(f"{path}:{number}: {what} is for programs, not the library")
            elif target not in ALLOWED[layer]:
                problems.append(f"{path}:{number}: layer '{layer}' includes {what} "
                                f"(layer '{target}'); it may include only "
                                f"{', '.join(sorted(ALLOWED[layer] | {layer}))}")
            elif layer in ON_TOP and target in CORE and not public and target != "util":
                problems.append(f"{path}:{number}: layer '{layer}' includes the core's internal "
                                f"{what}; it uses the core through its public headers")
    for problem in problems:
        print(problem)
    print(f"check_layers: {len(files)} files in {len(ALLOWED)} layers, "
          f"{len(problems)} violation(s)")
    return 1 if problems else 0


def check_installed(prefix):
    include = pathlib.Path(prefix) / "include"
    base = include / "ddp"
    problems = []
    headers = sorted(p for p in base.rglob("*") if p.is_file())
    installed = {str(p.relative_to(include)) for p in headers}
    for path in headers:
        if path.suffix != ".h":
            problems.append(f"{path}: not a header")
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            bracket, what = match.group(1), match.group(2)
            if bracket == '"' or (what.startswith("ddp/") and what not in installed):
                problems.append(f"{path}:{number}: includes {what}, which is not installed")
            elif what in FORBIDDEN_IN_PUBLIC:
                problems.append(f"{path}:{number}: includes <{what}>: "
                                f"{FORBIDDEN_IN_PUBLIC[what]} in a user's translation unit")
    core = sorted(p.name for p in base.glob("*.h"))
    if len(core) > CORE_BUDGET:
        problems.append(f"{base}: {len(core)} core headers, more than the budget of "
                        f"{CORE_BUDGET}: {' '.join(core)}")
    # What <ddp/ddp.h> reaches, following ddp includes.
    reached, todo = set(), ["ddp/ddp.h"]
    while todo:
        name = todo.pop()
        if name in reached or name not in installed:
            continue
        reached.add(name)
        for line in (include / name).read_text().splitlines():
            match = INCLUDE.match(line)
            if match and match.group(2).startswith("ddp/"):
                todo.append(match.group(2))
    outside = sorted(n for n in reached if n.count("/") != 1)
    for name in outside:
        problems.append(f"{base / 'ddp.h'}: reaches {name}, which is not a core header")
    for problem in problems:
        print(problem)
    print(f"check_layers: {len(headers)} installed headers, {len(core)} in the core, "
          f"{len(reached)} reached from ddp/ddp.h, {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 3 and args[1] == "--installed":
        sys.exit(check_installed(args[2]))
    root = args[0] if args else pathlib.Path(__file__).resolve().parent.parent
    sys.exit(check_sources(root))

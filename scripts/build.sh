#!/usr/bin/env bash
# Configures and builds ddp (library, examples, tests) in build/ (or $DDP_BUILD_DIR).
# Extra arguments go to CMake's configure step, e.g. -DCMAKE_PREFIX_PATH=<torch cmake prefix>.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=ON "$@"
cmake --build "$build" -j "$(nproc)"

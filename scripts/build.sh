#!/usr/bin/env bash
# Configures and builds ddp (library, examples, tests) in build/ (or $DDP_BUILD_DIR) against the
# LibTorch of the project's environment (.venv, from scripts/setup.sh) unless the arguments name
# another. Extra arguments go to CMake's configure step, e.g. -DCMAKE_PREFIX_PATH=<libtorch>.
# ccache, when installed, keeps compiled objects for the next build of the same sources.
# DDP_BUILD_TARGETS (space-separated) builds only those targets and what they need; unset: all.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Precompiled headers: without these ccache would not cache the sources that use them.
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  # Paths relative to the checkout: a second worktree or a fresh clone hits the same cache.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=ON "${launcher[@]}" "$@"
targets=()
for target in ${DDP_BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"

#!/usr/bin/env bash
# Fresh Debian 12 -> every test: installs what is missing, builds, runs ctest (unit tests,
# multi-rank tests under mpirun with 1, 2 and 4 ranks, the demo briefly, the installed package).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure "$@"

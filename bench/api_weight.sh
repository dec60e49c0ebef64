#!/usr/bin/env bash
# What a user's translation unit pays for <ddp/ddp.h>: the installed headers, the ddp headers a
# file that includes <ddp/ddp.h> reaches, whether MPI, NCCL, the CUDA runtime, <thread> or
# <mutex> reach it, and the time to compile it (COMPILES runs), with the flags of a consumer
# build of the installed package (tests/consumer, built by ctest's consumer_build).
# Usage: bench/api_weight.sh [BUILD_DIR (build)] [COMPILES (3); ctest's api_weight_figures: 0]
set -euo pipefail
build=${1:-build} compiles=${2:-3}
prefix=$build/tests/consumer-prefix
flags=$build/tests/consumer-build/CMakeFiles/consumer.dir/flags.make
[ -f "$flags" ] || { echo "api_weight: no $flags: run 'ctest -R consumer_build' in $build first" >&2; exit 1; }
defs=$(sed -n 's/^CXX_DEFINES = //p' "$flags")
incs=$(sed -n 's/^CXX_INCLUDES = //p' "$flags")
cxxf=$(sed -n 's/^CXX_FLAGS = //p' "$flags")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include <ddp/ddp.h>\nint main() { return 0; }\n' > "$tmp/a.cpp"
# shellcheck disable=SC2086
c++ $defs $incs $cxxf -H -fsyntax-only "$tmp/a.cpp" 2> "$tmp/h.txt"
count() { grep -cE "$1" "$tmp/h.txt" || true; }
echo "installed headers:              $(find "$prefix/include/ddp" -name '*.h' | wc -l) (core: $(find "$prefix/include/ddp" -maxdepth 1 -name '*.h' | wc -l))"
echo "ddp headers reached from ddp.h: $(grep -o 'include/ddp/[^ ]*' "$tmp/h.txt" | sort -u | wc -l)"
echo "all headers reached:            $(grep -c '^\.' "$tmp/h.txt")"
echo "mpi.h / nccl.h / cuda_runtime:  $(count '/mpi\.h$') / $(count '/nccl\.h$') / $(count 'cuda_runtime')"
# -H prints a header once, where it is first included, indented by depth: its includer is the
# last line one dot less deep.
via=$(awk '{ d = index($0, " ") - 1; path[d] = $2 }
           $2 ~ /\/(thread|mutex)$/ { sub(/.*\/include\//, "", path[d - 1]); printf "%s ", path[d - 1] }' \
      "$tmp/h.txt")
echo "<thread> / <mutex> first included by: ${via:-none} (no ddp header includes them: check_layers.py --installed)"
for _ in $(seq 1 "$compiles"); do
  start=$(date +%s%N)
  # shellcheck disable=SC2086
  c++ $defs $incs $cxxf -c "$tmp/a.cpp" -o "$tmp/a.o"
  echo "compile of a file including <ddp/ddp.h>: $(( ($(date +%s%N) - start) / 1000000 )) ms"
done

#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of fuzz/ (IDX, CIFAR-10 binary and snapshot readers'
# checks) with Debian's clang, libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer.
# The targets fuzz the pure checks the readers share (data/idx_format.h, data/cifar_format.h,
# train/snapshot_format.h), compiled on their own: no LibTorch (built with gcc) is linked.
#
# Usage: scripts/fuzz.sh [--ci] [TARGET...]     TARGET: idx, cifar, snapshot (default: all)
#   --ci   what ctest runs (fuzz_short_run): each target replays its corpus, fuzz/corpus/TARGET/,
#          then fuzzes for DDP_FUZZ_SECONDS (default 2) seconds; no files are written to fuzz/.
#   else   a long run: each target fuzzes for DDP_FUZZ_SECONDS (default 600) seconds, growing a
#          working corpus in $DDP_FUZZ_BUILD/corpus/TARGET (seeded from fuzz/corpus/TARGET).
# A crash leaves its input in $DDP_FUZZ_BUILD/crashes/: fix the bug, then copy the input into
# fuzz/corpus/TARGET/ as bug-<what>, where the unit tests (FuzzCorpus.*) replay it through the
# real reader and the CI run replays it through the target.
# Environment: DDP_FUZZ_BUILD (default build/fuzz), CXX_FUZZ (default clang++).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${DDP_FUZZ_BUILD:-$root/build/fuzz}
cxx=${CXX_FUZZ:-clang++}
ci=0
targets=()
for arg in "$@"; do
  case "$arg" in
    --ci) ci=1 ;;
    idx|cifar|snapshot) targets+=("$arg") ;;
    *) echo "fuzz.sh: unknown argument '$arg' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(idx cifar snapshot)
if ! command -v "$cxx" > /dev/null; then
  echo "fuzz.sh: $cxx not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 2
fi
seconds=${DDP_FUZZ_SECONDS:-$([ $ci = 1 ] && echo 2 || echo 600)}
mkdir -p "$out/crashes"

sources_of() {
  case "$1" in
    idx) echo "$root/framework/src/train/idx_format.cpp" ;;
    cifar) echo "$root/framework/src/train/cifar_format.cpp" ;;
    snapshot) echo "$root/framework/src/train/snapshot_format.cpp -lxxhash" ;;
  esac
}

# Build: each target only when a source is newer than its binary.
for t in "${targets[@]}"; do
  bin=$out/fuzz_$t
  # shellcheck disable=SC2046
  srcs=("$root/fuzz/fuzz_$t.cpp" $(sources_of "$t"))
  stale=0
  [ -x "$bin" ] || stale=1
  for s in "${srcs[@]}"; do
    [ "${s#-}" = "$s" ] || continue
    [ "$s" -nt "$bin" ] && stale=1
    case "$s" in *.cpp) [ "${s%.cpp}.h" -nt "$bin" ] 2>/dev/null && stale=1 ;; esac
  done
  if [ $stale = 1 ]; then
    start=$(date +%s%N)
    "$cxx" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
      -I "$root/framework/src" "${srcs[@]}" -o "$bin"
    echo "fuzz.sh: built fuzz_$t in $(( ($(date +%s%N) - start) / 1000000 )) ms"
  fi
done

status=0
for t in "${targets[@]}"; do
  corpus=$root/fuzz/corpus/$t
  if [ $ci = 1 ]; then
    # Replay every kept input, then fuzz from them; new inputs go to a scratch folder. The log's
    # last lines (the crash report, when there is one) are shown.
    scratch=$(mktemp -d)
    log=$out/$t.log
    if "$out/fuzz_$t" -runs=0 "$corpus" > "$log" 2>&1 &&
       "$out/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=1024 \
         -artifact_prefix="$out/crashes/$t-" "$scratch" "$corpus" >> "$log" 2>&1; then
      echo "fuzz_$t: $(ls "$corpus" | wc -l) kept inputs replayed; $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -n 1)"
    else
      tail -n 40 "$log"
      status=1
    fi
    rm -rf "$scratch"
  else
    mkdir -p "$out/corpus/$t"
    "$out/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=1024 \
      -artifact_prefix="$out/crashes/$t-" "$out/corpus/$t" "$corpus" || status=1
  fi
done
[ $status = 0 ] && echo "fuzz.sh: ${targets[*]}: no crash" || echo "fuzz.sh: a target crashed: inputs in $out/crashes/" >&2
exit $status

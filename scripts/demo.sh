#!/usr/bin/env bash
# Fresh Debian 12 -> the seed MNIST CNN training data-parallel on 2 MPI ranks, one epoch of the
# built-in Fashion-MNIST. Extra arguments go to ddp_mnist (see ddp_mnist --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"

# The build's log goes to a file; the screen gets one status line that moves (on a terminal,
# redrawn in place) or a line per 10% (into a file), and the log's tail if the build fails.
log=${TMPDIR:-/tmp}/ddp-build.log
echo "demo: building ddp (full log: $log)"
progress() {
  local line percent shown=-10 tty=0 width=${COLUMNS:-100}
  [ -t 1 ] && tty=1
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$log"
    [[ $line =~ ^\[\ *([0-9]+)%\]\ (.*)$ ]] || continue
    percent=${BASH_REMATCH[1]}
    if [ $tty = 1 ]; then
      printf '\r\033[K%s' "$(printf 'demo: build [%3d%%] %s' "$percent" "${BASH_REMATCH[2]}" |
                              cut -c "1-$((width - 1))")"
    elif [ "$percent" -ge $((shown + 10)) ]; then
      shown=$percent
      echo "demo: build [$percent%] ${BASH_REMATCH[2]}"
    fi
  done
  [ $tty = 0 ] || printf '\r\033[K'
}
: > "$log"
start=$(date +%s)
# Only what the demo runs: the library and ddp_mnist (scripts/test.sh builds the rest).
if ! DDP_BUILD_TARGETS=ddp_mnist "$root/scripts/build.sh" 2>&1 | progress; then
  echo "demo: the build failed; the end of $log:"
  tail -n 40 "$log"
  exit 1
fi
echo "demo: built in $(( $(date +%s) - start )) s"

. "$root/scripts/mpi_env.sh"
ranks=2
# Split the cores between the ranks unless the user chose a thread count.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))}
set -x
mpirun -np "$ranks" "${DDP_BUILD_DIR:-$root/build}/examples/ddp_mnist" --epochs 1 "$@"

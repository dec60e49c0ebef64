#!/usr/bin/env bash
# Fresh Debian 12 -> the seed MNIST CNN training data-parallel on 2 MPI ranks, one epoch of the
# built-in Fashion-MNIST. Extra arguments go to ddp_mnist (see ddp_mnist --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" > "${TMPDIR:-/tmp}/ddp-build.log" || { tail -n 40 "${TMPDIR:-/tmp}/ddp-build.log"; exit 1; }
. "$root/scripts/mpi_env.sh"
ranks=2
# Split the cores between the ranks unless the user chose a thread count.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))}
set -x
mpirun -np "$ranks" "${DDP_BUILD_DIR:-$root/build}/examples/ddp_mnist" --epochs 1 "$@"

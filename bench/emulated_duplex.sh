#!/usr/bin/env bash
# How fast each transport moves data both ways at once across two emulated hosts (network
# namespaces, tbf-shaped link, as bench/emulated_hosts.sh): a plain MPI exchange (one way vs
# both ways), ddp's all-reduce (its socket ring: two hosts) and raw MPI_Allreduce
# (bench_allreduce), and PyTorch's gloo
# all-reduce. Needs root. Prints plain text; the numbers are recorded in docs/records/performance.md.
#   bench/emulated_duplex.sh [RATE (100mbit)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
rate=${1:-100mbit}
. "$root/tests/cluster/netns_hosts.sh"
. "$root/scripts/mpi_env.sh"
work=$(mktemp -d /tmp/ddp-duplex.XXXXXX)
prefix=ddpd$$-
cleanup() { netns_destroy; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 1' INT TERM
netns_create "$work" "$prefix" 1 h1 h2 || { echo "emulated hosts: $NETNS_ERROR" >&2; exit 1; }
netns_shape h1 "$rate"
netns_shape h2 "$rate"
export DDP_NETNS_PREFIX=$prefix DDP_NETNS_HOSTS=$work/hosts OMP_NUM_THREADS=1
agent=$root/tests/cluster/netns_agent.sh
mpicc -O2 "$root/bench/mpi_exchange.c" -o "$work/mpi_exchange"

# A 2-rank job started on h1 with ddprun; extra environment (MCA parameters) from $EXTRA_ENV.
launch() {
  local line
  printf -v line '%q ' env OMPI_MCA_plm_rsh_agent="$agent" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
    DDP_NETNS_PREFIX="$prefix" DDP_NETNS_HOSTS="$work/hosts" ${EXTRA_ENV:-} \
    "$root/launch/ddprun" --hostfile "$work/hostfile" --iface eth0 -n 2 -t 1 -x MASTER_ADDR=192.0.2.1 "$@"
  "$agent" h1 "cd $(printf %q "$work") && $line" 2>&1 | grep -v '^ddp:\|socket.cpp'
}

echo "== link: $rate each way (tc tbf on both ends of both veths)"
echo "== Open MPI point to point, 16 MiB"
launch "$work/mpi_exchange"
echo "== Open MPI point to point, 16 MiB, btl_tcp_links=4"
EXTRA_ENV="OMPI_MCA_btl_tcp_links=4" launch "$work/mpi_exchange"
echo "== all-reduce, ddp MpiCommunicator and raw MPI_Allreduce"
launch "$build/bench/bench_allreduce" --min-bytes 1MiB --max-bytes 16MiB
echo "== all-reduce, PyTorch gloo"
launch "${DDP_PYTHON:-$root/.venv/bin/python}" "$root/bench/gloo_allreduce.py"

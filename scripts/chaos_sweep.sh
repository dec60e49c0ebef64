#!/usr/bin/env bash
# Usage: scripts/chaos_sweep.sh [FIRST_SEED] [SEEDS] [FAULTS_PER_SEED]   (defaults 1 20 20)
# The chaos run of tests/system/chaos_check.sh (ctest chaos_run_20_faults runs one seed) over many
# seeds: every fault must end its job within its bound with the documented status and message,
# and the resumed run must reach the uninterrupted model bit for bit. Stops at the first
# failure and prints the seed that repeats it. Needs a build (scripts/build.sh) in build/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
first=${1:-1} seeds=${2:-20} faults=${3:-20}
b=$root/build
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for seed in $(seq "$first" $(( first + seeds - 1 ))); do
  "$root/tests/system/chaos_check.sh" "$seed" "$faults" mpirun "$b/examples/ddp_mnist" \
    "$b/tools/ddp_compare_models" "$b/tests/libstall_write.so" "/tmp/ddp_chaos_$seed" |
    sed "s/^/seed $seed: /"
done
echo "PASS: $seeds seeds x $faults faults"

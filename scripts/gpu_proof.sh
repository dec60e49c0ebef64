#!/usr/bin/env bash
# Builds ddp against the CUDA PyTorch of python3 and proves the GPU path on this machine: the GPU
# tests (NCCL communicator, DDP on CUDA, SyncBatchNorm over NCCL, the watchdog), the unit tests,
# `mnist` on the GPU, `ddp_mnist` on one rank over NCCL, and the seed CNN's training throughput
# against PyTorch DDP on the same GPU. Meant for a GPU machine with python3 + CUDA torch, nvcc and
# CMake, but maybe without MPI, Boost, GoogleTest or zlib headers, and without internet: what is
# missing is unpacked with `dpkg -x` from .debs/, which scripts/fetch_gpu_debs.sh downloads on a
# Debian 12 machine. docs/gpu.md explains what the steps prove.
#
# Usage: scripts/gpu_proof.sh [--deps-only]
#   --deps-only       unpack and check the dependencies (mpirun -np 1 hostname), build nothing
# Environment:
#   OUT               where the results go (summary.txt, machine.txt, one log per step);
#                     default <build>/out
#   DDP_PROOF_BUILD   build directory, default build-gpu-proof in the repository
#   DDP_PROOF_UNPACK  "all": use the .debs even for what the machine has
#   PYTHON            the python with CUDA torch, default python3
#   JOBS              parallel build jobs, default nproc
# Exit status: 0 when every step passed; summary.txt lists each step either way.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_PROOF_BUILD:-$root/build-gpu-proof}
out=${OUT:-$build/out}
python=${PYTHON:-python3}
jobs=${JOBS:-$(nproc)}
debs=$root/.debs
prefix=$build/deps
deps_only=0
[ "${1:-}" = "--deps-only" ] && deps_only=1
mkdir -p "$out" "$prefix"
: > "$out/summary.txt"
failed=0

log() { echo "gpu_proof: $*" | tee -a "$out/summary.txt"; }

# step NAME COMMAND...: runs COMMAND with its output in $OUT/NAME.log and records the result.
step() {
  local name=$1 start status
  shift
  start=$(date +%s)
  echo "gpu_proof: running $name: $*"
  "$@" > "$out/$name.log" 2>&1
  status=$?
  if [ $status -eq 0 ]; then
    log "PASS $name ($(( $(date +%s) - start )) s)"
  else
    log "FAIL $name (exit $status, $(( $(date +%s) - start )) s; see $name.log)"
    tail -n 20 "$out/$name.log"
    failed=1
  fi
  return $status
}

have_system() {
  [ "${DDP_PROOF_UNPACK:-}" != all ] && "$@" > /dev/null 2>&1
}

unpack() {
  local component=$1 deb
  if ! ls "$debs/$component"/*.deb > /dev/null 2>&1; then
    log "FAIL unpack $component: no $debs/$component/*.deb (run scripts/fetch_gpu_debs.sh)"
    failed=1
    return 1
  fi
  for deb in "$debs/$component"/*.deb; do
    if command -v dpkg > /dev/null; then
      dpkg -x "$deb" "$prefix"
    else  # a .deb is an ar archive holding data.tar.xz (Debian 12)
      ar p "$deb" data.tar.xz | tar -xJ -C "$prefix"
    fi
  done
  log "unpacked $component ($(find "$debs/$component" -name '*.deb' | wc -l) packages) into $prefix"
}

# --- The machine -------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") / $(uname -r)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "compiler: $(c++ --version 2>&1 | head -n 1)"
  echo "cmake: $(cmake --version 2>&1 | head -n 1)"
  echo "nvcc: $(PATH=$PATH:/usr/local/cuda/bin nvcc --version 2>&1 | tail -n 1)"
  echo "gpus:"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "torch:"
  "$python" - <<'EOF' 2>&1
import torch
print("  version", torch.__version__, "cuda", torch.version.cuda,
      "cuda available", torch.cuda.is_available(),
      "cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI)
if torch.cuda.is_available():
    print("  device", torch.cuda.get_device_name(0), "nccl", torch.cuda.nccl.version())
EOF
  echo "on the machine: mpirun $(command -v mpirun || echo none)," \
       "mpicxx $(command -v mpicxx || echo none)," \
       "boost $(ls /usr/include/boost/program_options.hpp 2>/dev/null || echo none)," \
       "gtest $(ls /usr/include/gtest/gtest.h 2>/dev/null || echo none)," \
       "zlib $(ls /usr/include/zlib.h 2>/dev/null || echo none)"
} > "$out/machine.txt"
cat "$out/machine.txt"

torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
abi=$("$python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
if [ -z "$torch_prefix" ] && [ $deps_only -eq 0 ]; then
  log "FAIL torch: $python has no torch (set PYTHON)"
  exit 1
fi
if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# The NCCL that torch itself loads (pip's nvidia-nccl), so the process has only one.
nccl_root=$("$python" -c 'import nvidia.nccl as n; print(n.__path__[0])' 2>/dev/null)
[ -n "$nccl_root" ] && [ -e "$nccl_root/include/nccl.h" ] || nccl_root=

# --- Dependencies: the machine's own where present, else unpacked from .debs/ ------------------
# The torch folder first, so its lib/ wins over any other LibTorch in the system's folders.
torch_root=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
cmake_prefix="$torch_root;$torch_prefix;$prefix/usr"
cmake_args=()
lib=$prefix/usr/lib/x86_64-linux-gnu

if have_system command -v mpicxx && have_system command -v mpirun; then
  mpirun=$(command -v mpirun)
  log "MPI: the machine's ($mpirun)"
else
  unpack mpi
  # dpkg -x runs no maintainer scripts, so Debian's alternatives (mpirun, mpicxx) are missing.
  ln -sf mpirun.openmpi "$prefix/usr/bin/mpirun"
  ln -sf mpicxx.openmpi "$prefix/usr/bin/mpicxx"
  # Open MPI and the PMIx it loads look for their plugins and help files under the prefix they
  # were built for (/usr) unless told where they are now.
  export OPAL_PREFIX=$prefix/usr
  export PMIX_PKGDATADIR=$lib/pmix2/share/pmix PMIX_PKGLIBDIR=$lib/pmix2/lib/pmix
  export PATH=$prefix/usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  mpirun=$prefix/usr/bin/mpirun
  cmake_args+=(-DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.openmpi" -DMPIEXEC_EXECUTABLE="$mpirun")
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
step mpirun_hostname "$mpirun" -np 1 hostname
if [ -n "${OPAL_PREFIX:-}" ]; then
  step unpacked_libraries_resolve bash -c \
    "! ldd '$lib/libmpi.so.40' '$prefix/usr/bin/orterun' 2>&1 | grep -E 'not found|No such file'"
fi
# An MPI program built with this MPI's compiler wrapper, on two ranks.
cat > "$build/mpi_hello.cpp" <<'EOF_CPP'
#include <mpi.h>
#include <cstdio>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int one = 1;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("mpi_hello: %d ranks, all-reduce %d\n", size, sum);
  MPI_Finalize();
  return sum == size ? 0 : 1;
}
EOF_CPP
step mpi_hello bash -c \
  "'$(dirname "$mpirun")/mpicxx' '$build/mpi_hello.cpp' -o '$build/mpi_hello' &&
   '$mpirun' -np 2 '$build/mpi_hello' | grep 'mpi_hello: 2 ranks, all-reduce 2'"

examples=ON
if [ "$abi" = 0 ]; then
  # Debian's (and most distributions') Boost is built with the C++11 ABI, this torch without it:
  # the examples, which take std::string from Boost.Program_options, would not link.
  examples=OFF
  log "SKIP examples: this torch uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0)," \
      "the packaged Boost does not"
elif have_system test -e /usr/include/boost/program_options.hpp; then
  log "Boost: the machine's"
else
  unpack boost
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

if have_system test -e /usr/include/zlib.h; then
  log "zlib: the machine's"
else
  unpack zlib
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

if have_system test -e /usr/include/xxhash.h; then
  log "xxHash: the machine's"
else
  unpack xxhash
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

if have_system test -e /usr/include/nlohmann/json.hpp; then
  log "nlohmann-json: the machine's"
else
  unpack json
fi

data=/usr/share/datasets/fashion-mnist
if ! have_system test -e "$data/train-images-idx3-ubyte.gz"; then
  unpack data
  data=$prefix/usr/share/datasets/fashion-mnist
fi

# GoogleTest from its sources, built with torch's ABI, unless the machine has one that fits.
if have_system test -e /usr/include/gtest/gtest.h && [ "$abi" != 0 ]; then
  log "GoogleTest: the machine's"
else
  gtest_src=/usr/src/googletest
  if ! have_system test -e $gtest_src/CMakeLists.txt; then
    unpack gtest
    gtest_src=$prefix/usr/src/googletest
  fi
  if [ $deps_only -eq 0 ]; then
    step gtest_build bash -c "cmake -S '$gtest_src' -B '$build/gtest-build' \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
        -DCMAKE_INSTALL_PREFIX='$prefix/gtest' -DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=${abi:-1} &&
      cmake --build '$build/gtest-build' -j $jobs && cmake --install '$build/gtest-build'"
    cmake_prefix="$cmake_prefix;$prefix/gtest"
  fi
fi

if [ $deps_only -eq 1 ]; then
  log "deps-only: done"
  exit $failed
fi

# --- Build and run -----------------------------------------------------------------------------
step configure cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=ON \
  -DDDP_BUILD_BENCH=$examples -DDDP_BUILD_EXAMPLES=$examples -DCMAKE_PREFIX_PATH="$cmake_prefix" \
  -DDDP_PYTHON="$(command -v "$python")" ${nccl_root:+-DNCCL_ROOT="$nccl_root"} "${cmake_args[@]}"
if ! grep -q "building the NCCL communicator and the GPU tests" "$out/configure.log"; then
  log "FAIL configure: no CUDA LibTorch + NCCL communicator; its ddp: lines:"
  grep "ddp:" "$out/configure.log" | tee -a "$out/summary.txt"
  exit 1
fi
targets=(gpu_tests nccl_timeout_probe unit_tests distributed_tests)
[ $examples = ON ] && targets+=(mnist ddp_mnist bench_throughput)
step build cmake --build "$build" -j "$jobs" --target "${targets[@]}" || exit 1

step gpu_tests bash -c "cd '$build' && ctest -R '^gpu_' --output-on-failure"
step unit_tests "$build/tests/unit_tests"
# Several ranks share this machine's GPUs only on the CPU: NCCL cannot put two ranks on one GPU.
step distributed_tests_cpu bash -c \
  "cd '$build' && CUDA_VISIBLE_DEVICES= ctest -R '^distributed_np' --output-on-failure"
if [ $examples = ON ]; then
  step mnist_gpu "$build/examples/mnist" --epochs 1 --data-dir "$data"
  if ! grep -q "device cuda" "$out/mnist_gpu.log" ||
     ! grep -q "Test set: Average loss" "$out/mnist_gpu.log"; then
    log "FAIL mnist_gpu: did not train on the GPU to a test result"
    failed=1
  fi
  # NCCL_DEBUG=INFO makes NCCL print its set-up, which shows the rank trained over NCCL.
  step ddp_mnist_nccl env NCCL_DEBUG=INFO "$mpirun" -np 1 "$build/examples/ddp_mnist" --epochs 1 \
    --data-dir "$data" --metrics-file "$out/ddp_mnist_metrics.jsonl"
  grep -q "NCCL INFO" "$out/ddp_mnist_nccl.log" ||
    { log "FAIL ddp_mnist_nccl: NCCL never started (did the rank get a GPU?)"; failed=1; }
  # The data pipeline's share of mnist's step (the whole data set lives on the GPU).
  grep "^Epoch" "$out/mnist_gpu.log" | tee -a "$out/summary.txt"

  # Training steps of the seed CNN at batch 64 on this GPU: ddp (C++) against PyTorch DDP from
  # this python, both at one rank over NCCL, the same model, batch and synthetic data.
  bench=(--model cnn --batch-size 64 --warmup-steps 50 --window-steps 500 --windows 5
         --device cuda --out "$out/throughput_gpu.jsonl")
  step throughput_ddp "$mpirun" -np 1 "$build/bench/bench_throughput" "${bench[@]}"
  step throughput_pytorch "$mpirun" -np 1 "$python" "$root/bench/pytorch_ddp.py" "${bench[@]}"
  "$python" - "$out/throughput_gpu.jsonl" <<'EOF' 2>&1 | tee -a "$out/summary.txt"
import json, sys
rate = {r["impl"]: r["samples_per_sec"] for r in map(json.loads, open(sys.argv[1]))}
for impl in sorted(rate):
    print(f"gpu_proof: {impl}: {rate[impl]:.0f} samples/s")
if "ddp-bucketed" in rate and "pytorch-ddp" in rate:
    print(f"gpu_proof: ddp / PyTorch DDP = {rate['ddp-bucketed'] / rate['pytorch-ddp']:.2f}x")
EOF
fi
log "results in $out"
exit $failed

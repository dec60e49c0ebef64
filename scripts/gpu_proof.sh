#!/usr/bin/env bash
# Builds ddp against the CUDA PyTorch of python3 and proves the GPU path on this machine, writing
# one report (report.md) of what it checked, row by row, with the device and the date, and of
# what one GPU cannot show; docs/gpu.md ("Proving it on a GPU machine") quotes its rows. The
# steps: the GPU tests (ctest's gpu label: the NCCL communicator, DDP on CUDA, the NCCL Reducer
# at world size 1 against the CPU result, SyncBatchNorm over NCCL, the comm hooks, the overlapped
# optimizer step and ZeRO-1 on CUDA tensors, the watchdog), the unit and
# distributed tests on the CPU, `mnist` on the GPU, `ddp_mnist` on one rank over NCCL, a
# mid-epoch SIGTERM and resume on the GPU compared bit for bit, `--replicas-per-process 1` on the
# GPU, and the seed CNN's training throughput against PyTorch DDP on the same GPU. Meant for a GPU
# machine with python3 + CUDA torch, nvcc and CMake, but maybe without MPI, Boost, GoogleTest or
# zlib headers, and without internet: what is missing is unpacked with `dpkg -x` from .debs/,
# which scripts/fetch_gpu_debs.sh downloads on a Debian 12 machine.
#
# Usage: scripts/gpu_proof.sh [--deps-only | --dry-run]
#   --deps-only       unpack and check the dependencies (mpirun -np 1 hostname), build nothing
#   --dry-run         no GPU needed (ctest's gpu_proof_dry_run): the CPU stands in, so that the
#                     first run on a GPU fails for no reason but the GPU. Configures a scratch
#                     tree with the real run's arguments and checks it has every target the real
#                     run builds, then runs every step, tiny, on the CPU against an already built
#                     tree (DDP_PROOF_BUILD, default build/), and writes the same report.
# Environment:
#   OUT               where the results go (report.md, summary.txt, machine.txt, one log per
#                     step); default <build>/out (dry run: <build>/gpu-proof-dry-run)
#   DDP_PROOF_BUILD   build directory, default build-gpu-proof in the repository (dry run: build)
#   DDP_PROOF_UNPACK  "all": use the .debs even for what the machine has
#   PYTHON            the python with CUDA torch, default python3
#   JOBS              parallel build jobs, default nproc
# Exit status: 0 when every step passed; summary.txt and report.md list each step either way.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deps_only=0 dry=0
case "${1:-}" in
  --deps-only) deps_only=1 ;;
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "gpu_proof: unknown argument '$1' (expected --deps-only or --dry-run)" >&2; exit 2 ;;
esac
if [ $dry -eq 1 ]; then
  build=${DDP_PROOF_BUILD:-$root/build}
  out=${OUT:-$build/gpu-proof-dry-run}
  rm -rf "$out"
else
  build=${DDP_PROOF_BUILD:-$root/build-gpu-proof}
  out=${OUT:-$build/out}
fi
# By its full path, found once before PATH changes below: on the first GPU machine the
# throughput step's `mpirun -np 1 python3` found no torch, though python3 had found it at the start.
python=$(command -v "${PYTHON:-python3}" || echo "${PYTHON:-python3}")
jobs=${JOBS:-$(nproc)}
debs=$root/.debs
# The dry run writes nothing into the built tree it runs from but $out.
scratch=$build
[ $dry -eq 1 ] && scratch=$out
prefix=$scratch/deps
mkdir -p "$out" "$prefix"
: > "$out/summary.txt"
failed=0
declare -A result   # step name -> "PASS (12 s)" / "FAIL (...)"

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
    result[$name]="PASS ($(( $(date +%s) - start )) s)"
    log "PASS $name ($(( $(date +%s) - start )) s)"
  else
    result[$name]="FAIL (exit $status; $name.log)"
    log "FAIL $name (exit $status, $(( $(date +%s) - start )) s; see $name.log)"
    tail -n 20 "$out/$name.log"
    failed=1
  fi
  return $status
}

have_system() {
  [ "${DDP_PROOF_UNPACK:-}" != all ] && "$@" > /dev/null 2>&1
}

# A development package is there when its header and its library both are: an image may hold a
# library's headers without the library (Ubuntu's libboost-dev without program_options' .so).
have_dev() {
  local header=$1 library=$2
  have_system test -e "/usr/include/$header" &&
    { have_system compgen -G "/usr/lib/*/$library" || have_system compgen -G "/usr/lib/$library"; }
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
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
  else
    echo "  none: no nvidia-smi"
  fi
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
cat > "$scratch/mpi_hello.cpp" <<'EOF_CPP'
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
  "'$(dirname "$mpirun")/mpicxx' '$scratch/mpi_hello.cpp' -o '$scratch/mpi_hello' &&
   '$mpirun' -np 2 '$scratch/mpi_hello' | grep 'mpi_hello: 2 ranks, all-reduce 2'"

examples=ON
if [ "$abi" = 0 ]; then
  # Debian's (and most distributions') Boost is built with the C++11 ABI, this torch without it:
  # the examples, which take std::string from Boost.Program_options, would not link.
  examples=OFF
  log "SKIP examples: this torch uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0)," \
      "the packaged Boost does not"
elif have_dev boost/program_options.hpp "libboost_program_options.so"; then
  log "Boost: the machine's"
else
  unpack boost
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Named outright: the machine's BoostConfig (another version, headers only) comes first in
  # CMake's search otherwise, and then refuses the unpacked program_options.
  for config in "$prefix"/usr/lib/*/cmake/Boost-*/BoostConfig.cmake; do
    [ -e "$config" ] && cmake_args+=(-DBoost_DIR="$(dirname "$config")")
  done
fi

if have_dev zlib.h "libz.so"; then
  log "zlib: the machine's"
else
  unpack zlib
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

if have_dev xxhash.h "libxxhash.so"; then
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
if have_dev gtest/gtest.h "libgtest.*" && [ "$abi" != 0 ]; then
  log "GoogleTest: the machine's"
else
  gtest_src=/usr/src/googletest
  if ! have_system test -e $gtest_src/CMakeLists.txt; then
    unpack gtest
    gtest_src=$prefix/usr/src/googletest
  fi
  if [ $deps_only -eq 0 ]; then
    step gtest_build bash -c "cmake -S '$gtest_src' -B '$scratch/gtest-build' \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
        -DCMAKE_INSTALL_PREFIX='$prefix/gtest' -DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=${abi:-1} &&
      cmake --build '$scratch/gtest-build' -j $jobs && cmake --install '$scratch/gtest-build'"
    cmake_prefix="$cmake_prefix;$prefix/gtest"
  fi
fi

if [ $deps_only -eq 1 ]; then
  log "deps-only: done"
  exit $failed
fi

# --- Build --------------------------------------------------------------------------------------
configure_args=(-DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=ON -DDDP_BUILD_BENCH=$examples
  -DDDP_BUILD_EXAMPLES=$examples -DCMAKE_PREFIX_PATH="$cmake_prefix"
  -DDDP_PYTHON="$(command -v "$python")" ${nccl_root:+-DNCCL_ROOT="$nccl_root"} "${cmake_args[@]}")
targets=(gpu_tests nccl_timeout_probe unit_tests distributed_tests)
[ $examples = ON ] && targets+=(mnist ddp_mnist ddp_mnist_signal_at_step ddp_compare_models
                                bench_throughput)
if [ $dry -eq 0 ]; then
  step configure cmake -S "$root" -B "$build" "${configure_args[@]}"
  if ! grep -q "building the NCCL communicator and the GPU tests" "$out/configure.log"; then
    log "FAIL configure: no CUDA LibTorch + NCCL communicator; its ddp: lines:"
    grep "ddp:" "$out/configure.log" | tee -a "$out/summary.txt"
    exit 1
  fi
  step build cmake --build "$build" -j "$jobs" --target "${targets[@]}" || exit 1
else
  # The real run's configure line, in a scratch tree (a CPU LibTorch has no GPU targets: the
  # dry run then looks only for the others), and the binaries of the tree the steps run from.
  step configure cmake -S "$root" -B "$scratch/configure-check" "${configure_args[@]}" || exit 1
  grep -q "building the NCCL communicator and the GPU tests" "$out/configure.log" ||
    targets=("${targets[@]:2}")
  binaries=(tests/unit_tests tests/distributed_tests)
  [ $examples = ON ] && binaries+=(examples/mnist examples/ddp_mnist tests/ddp_mnist_signal_at_step
                                   tools/ddp_compare_models bench/bench_throughput)
  step build bash -c "cmake --build '$scratch/configure-check' --target help > '$out/targets.txt' &&
    for t in ${targets[*]}; do grep -Eq \"(^|[ .:/])\$t(\$|[ :])\" '$out/targets.txt' ||
      { echo \"the configured tree has no target \$t\"; exit 1; }; done &&
    cd '$build' && for f in ${binaries[*]}; do test -x \$f ||
      { echo \"$build has no \$f: build it first\"; exit 1; }; done" || exit 1
  rm -rf "$scratch/configure-check"
fi

# --- Run ----------------------------------------------------------------------------------------
# The real run on the rank's GPU; the dry run the same commands, tiny, with the CPU standing in.
if [ $dry -eq 0 ]; then
  device=cuda no_cuda=() limit=0 replica_limit=50 unit_filter='*' dist_filter='*'
  ctest_dist='^distributed_np'
  bench_steps=(--warmup-steps 50 --window-steps 500 --windows 5)
else
  device=cpu no_cuda=(--no-cuda) limit=4 replica_limit=4 unit_filter='Bucketing*'
  dist_filter='ReducerAtOneRank.*:SnapshotCudaGenerator.*' ctest_dist='^distributed_np1$'
  bench_steps=(--warmup-steps 2 --window-steps 3 --windows 1)
fi
step gpu_tests bash -c "cd '$build' && ctest -L '^gpu\$' --output-on-failure"
# One GPU runs the NCCL Reducer only with DDPOptions::reducer_at_one_rank: its own row. The dry
# run, with no GPU, runs the CPU side of it (the option at one rank equals a plain step).
if [ $dry -eq 0 ]; then
  step nccl_reducer_one_rank env GTEST_FILTER='GpuDdp.NcclReducer*' \
    "$mpirun" -np 1 "$build/tests/gpu/gpu_tests"
else
  step nccl_reducer_one_rank env GTEST_FILTER='ReducerAtOneRank.*' \
    "$mpirun" -np 1 "$build/tests/distributed_tests"
fi
if [ $examples = ON ]; then
  step mnist_gpu "$build/examples/mnist" --epochs 1 --data-dir "$data" \
    --limit-train-batches $limit "${no_cuda[@]}"
  if ! grep -q "device $device" "$out/mnist_gpu.log" ||
     ! grep -q "Test set: Average loss" "$out/mnist_gpu.log"; then
    log "FAIL mnist_gpu: did not train on $device to a test result"
    result[mnist_gpu]="FAIL (not on $device to a test result)"
    failed=1
  fi
  # NCCL_DEBUG=INFO makes NCCL print its set-up, which shows the rank trained over NCCL.
  step ddp_mnist_nccl env NCCL_DEBUG=INFO "$mpirun" -np 1 "$build/examples/ddp_mnist" --epochs 1 \
    --data-dir "$data" --metrics-file "$out/ddp_mnist_metrics.jsonl" \
    --limit-train-batches $limit "${no_cuda[@]}"
  if [ $dry -eq 0 ] && ! grep -q "NCCL INFO" "$out/ddp_mnist_nccl.log"; then
    log "FAIL ddp_mnist_nccl: NCCL never started (did the rank get a GPU?)"
    result[ddp_mnist_nccl]="FAIL (NCCL never started)"
    failed=1
  fi
  # The data pipeline's share of mnist's step (the whole data set lives on the GPU).
  grep "^Epoch" "$out/mnist_gpu.log" | tee -a "$out/summary.txt"

  # A mid-epoch SIGTERM and --resume on the GPU, against the same run uninterrupted (2 epochs of
  # 6 steps, the signal after step 9): the seed CNN's dropout draws on the GPU, so the resumed
  # model is bit-identical only if the snapshot restored the CUDA generator too. The same run
  # twice first: if those differ, the GPU's kernels are not deterministic (cuDNN picks algorithms
  # with atomics unless told otherwise), and a difference after the resume says nothing about it.
  resume=$out/resume
  rm -rf "$resume"
  mnist_resume=(--data-dir "$data" --epochs 2 --batch-size 64 --limit-train-batches 6
                --test-batch-size 2000 --log-interval 0 --keep-checkpoints 0 --deterministic "${no_cuda[@]}")
  step resume_gpu bash -c "
    set -eo pipefail
    '$mpirun' -np 1 '$build/examples/ddp_mnist' ${mnist_resume[*]} --checkpoint-dir '$resume/full'
    '$mpirun' -np 1 '$build/examples/ddp_mnist' ${mnist_resume[*]} --checkpoint-dir '$resume/again'
    '$build/tools/ddp_compare_models' '$resume/full/model_with_epoch2.pt' \
      '$resume/again/model_with_epoch2.pt' ||
      { echo 'the same run twice differs: non-deterministic GPU kernels, not the resume'; exit 1; }
    status=0
    '$mpirun' -np 1 '$build/tests/ddp_mnist_signal_at_step' --signal-at-step=9:0:TERM \
      ${mnist_resume[*]} --checkpoint-dir '$resume/term' || status=\$?
    [ \$status -eq 75 ] || { echo \"the signalled run exited \$status, not 75\"; exit 1; }
    test -f '$resume/term/snapshot_epoch2_batch3.pt'
    '$mpirun' -np 1 '$build/examples/ddp_mnist' ${mnist_resume[*]} --checkpoint-dir '$resume/term' \
      --resume 2>&1 | tee '$resume/resumed.log'
    grep -q 'Resumed from .*snapshot_epoch2_batch3.pt' '$resume/resumed.log'
    if grep -q 'generator states' '$resume/resumed.log'; then exit 1; fi
    '$build/tools/ddp_compare_models' '$resume/full/model_with_epoch2.pt' \
      '$resume/term/model_with_epoch2.pt'"

  # The replica path (a thread per replica, the ReplicaCommunicator) with the one GPU there is.
  step replicas_one "$mpirun" -np 1 "$build/examples/ddp_mnist" --epochs 1 --data-dir "$data" \
    --replicas-per-process 1 --show-topology --limit-train-batches $replica_limit "${no_cuda[@]}"

  # Training steps of the seed CNN at batch 64 on this GPU: ddp (C++) against PyTorch DDP from
  # this python, both at one rank over NCCL, the same model, batch and synthetic data.
  bench=(--model cnn --batch-size 64 "${bench_steps[@]}" --device $device
         --out "$out/throughput_gpu.jsonl")
  rm -f "$out/throughput_gpu.jsonl"
  step throughput_ddp "$mpirun" -np 1 "$build/bench/bench_throughput" "${bench[@]}"
  step throughput_pytorch "$mpirun" -np 1 "$python" "$root/bench/pytorch_ddp.py" "${bench[@]}"
  "$python" - "$out/throughput_gpu.jsonl" <<'EOF_PY' 2>&1 | tee -a "$out/summary.txt" > "$out/throughput.txt"
import json, sys
rate = {r["impl"]: r["samples_per_sec"] for r in map(json.loads, open(sys.argv[1]))}
for impl in sorted(rate):
    print(f"gpu_proof: {impl}: {rate[impl]:.0f} samples/s")
if "ddp-bucketed" in rate and "pytorch-ddp" in rate:
    print(f"gpu_proof: ddp / PyTorch DDP = {rate['ddp-bucketed'] / rate['pytorch-ddp']:.2f}x")
EOF_PY
fi

# Last, the CPU tests (CI runs them too; 80 s on a 16-core machine): the GPU rows come first,
# should the run meet a time limit.
# The tests that read Fashion-MNIST look in DDP_MNIST_DIR: here it may be the unpacked copy.
step unit_tests env GTEST_FILTER="$unit_filter" DDP_MNIST_DIR="$data" "$build/tests/unit_tests"
# Several ranks share this machine's GPUs only on the CPU: NCCL cannot put two ranks on one GPU.
step distributed_tests_cpu env GTEST_FILTER="$dist_filter" DDP_MNIST_DIR="$data" bash -c \
  "cd '$build' && CUDA_VISIBLE_DEVICES= ctest -R '$ctest_dist' --output-on-failure"

# --- The report ---------------------------------------------------------------------------------
# One row per step: what it proves. docs/gpu.md quotes these rows; the dry run checks it names
# every one.
rows=(
  "gpu_tests|ctest -L gpu: the NCCL communicator at one rank (every dtype and op, stream ordering, async all-reduce, barrier), DDP over NCCL equal to one process on the global batch, backward not waiting for the GPU, SyncBatchNorm over NCCL, and the NCCL watchdog ending a job stuck behind a 10 s kernel with a 1 s timeout"
  "nccl_reducer_one_rank|the NCCL Reducer at world size 1 (DDPOptions::reducer_at_one_rank: hooks, buckets, the all-reduce on the NCCL stream and its events, rebuild): equal to the CPU result within 1e-5, and bit for bit to plain GPU steps"
  "unit_tests|the single-process tests, with the GPU visible"
  "distributed_tests_cpu|the multi-rank tests at 1, 2 and 4 ranks on the CPU (one GPU cannot hold several NCCL ranks)"
  "mnist_gpu|mnist, one epoch on the GPU, to a test result; its epoch line gives the data's share of the step"
  "ddp_mnist_nccl|ddp_mnist, one epoch on one rank over NCCL (NCCL_DEBUG=INFO shows NCCL starting)"
  "resume_gpu|a mid-epoch SIGTERM and --resume of ddp_mnist on the GPU (dropout on the GPU): the resumed model equals the uninterrupted one bit for bit, with the CUDA generator state from the snapshot (after two uninterrupted runs were equal: the kernels are deterministic)"
  "replicas_one|--replicas-per-process 1 on the GPU: the replica thread and its communicator, with one replica"
  "throughput_ddp|the seed CNN at batch 64, one rank: ddp's samples/s (bench_throughput)"
  "throughput_pytorch|the same with PyTorch DDP over NCCL from the same python (bench/pytorch_ddp.py); the ratio below"
)
cannot=(
  "NCCL between GPUs: real all-reduce traffic (NVLink, PCIe, the network), its overlap with backward, and bucket order agreed across ranks"
  "the multi-GPU replica path: --replicas-per-process N > 1, one GPU per replica thread, create_for_devices joining a process's GPUs in one NCCL group"
  "the NCCL watchdog naming another rank that never arrived (one rank cannot be missing)"
  "SyncBatchNorm statistics over several GPUs, and DDP on GPUs against one process on the global batch with more than one replica"
  "scaling: samples/s at 2 to 8 GPUs against PyTorch DDP, and NCCL's bootstrap across hosts"
)
not_yet=(
  "ddp_cifar (ResNet-18) samples/s against PyTorch DDP with AMP (bf16, and fp16 with the GradScaler), the loader's share of its step and the GPU memory peak"
  "the comm hooks and ZeRO-1 on CUDA tensors (their issue has not landed)"
)
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
{
  if [ $dry -eq 1 ]; then
    echo "# GPU proof: dry run on $(hostname), $(date -u +%Y-%m-%d)"
    echo
    echo "The CPU stood in for the GPU (scripts/gpu_proof.sh --dry-run): every step ran, tiny; no"
    echo "figure below is a GPU's."
  else
    echo "# GPU proof: ${gpu_name:-no GPU found} on $(hostname), $(date -u +%Y-%m-%d)"
  fi
  echo
  echo '```'
  cat "$out/machine.txt"
  echo '```'
  echo
  echo "| step | what it proves | result |"
  echo "|---|---|---|"
  for row in "${rows[@]}"; do
    name=${row%%|*}
    echo "| \`$name\` | ${row#*|} | ${result[$name]:-not run} |"
  done
  echo
  echo "Figures:"
  echo
  echo '```'
  grep -E "^Epoch|samples/s|ddp / PyTorch" "$out/summary.txt"
  echo '```'
  echo
  echo "What one GPU cannot show:"
  echo
  for line in "${cannot[@]}"; do echo "- $line"; done
  echo
  echo "Not in this proof yet:"
  echo
  for line in "${not_yet[@]}"; do echo "- $line"; done
} > "$out/report.md"

if [ $dry -eq 1 ]; then
  # The template itself: every row ran and passed, and docs/gpu.md lists every row.
  for row in "${rows[@]}"; do
    name=${row%%|*}
    [[ ${result[$name]:-} == PASS* ]] || { log "FAIL report: step $name: ${result[$name]:-not run}"; failed=1; }
    grep -q "\`$name\`" "$root/docs/gpu.md" ||
      { log "FAIL report: docs/gpu.md does not list the step \`$name\`"; failed=1; }
  done
fi
log "results in $out (report.md)"
exit $failed

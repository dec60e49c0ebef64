#!/usr/bin/env bash
# Builds ddp against the CUDA PyTorch of python3 and proves the GPU path on this machine, writing
# one report (report.md) of what it checked, row by row, with the device and the date, and of
# what one GPU cannot show; docs/gpu.md ("Proving it on a GPU machine") quotes its rows. The
# steps: the GPU tests (ctest's gpu label: the NCCL communicator, DDP on CUDA, the NCCL Reducer
# at world size 1 against the CPU result, SyncBatchNorm over NCCL, the comm hooks, the overlapped
# optimizer step and ZeRO-1 on CUDA tensors, the watchdog), the unit and
# distributed tests on the CPU, `mnist` on the GPU, `ddp_mnist` on one rank over NCCL, a
# mid-epoch SIGTERM and resume on the GPU compared bit for bit, `ddp_cifar` (ResNet-18) with
# AMP in bf16 and fp16, and the training throughput of the seed CNN and of ResNet-18 with AMP
# against PyTorch DDP on the same GPU. Meant for a GPU
# machine with python3 + CUDA torch, nvcc and CMake, but maybe without MPI, Boost, GoogleTest or
# zlib headers, and without internet: what is missing is unpacked with `dpkg -x` from .debs/,
# which scripts/fetch_gpu_debs.sh downloads on a Debian 12 machine.
#
# The GPU rows are built and run first; the CPU tests (which CI runs too) are built and run after
# them with what is left of a time budget, so that one call fits a machine lent 10 minutes a call.
#
# Usage: scripts/gpu_proof.sh [--deps-only | --dry-run | --cpu-tests]
#   --deps-only       unpack and check the dependencies (mpirun -np 1 hostname), build nothing
#   --cpu-tests       only the CPU tests' rows (for a second call when the budget ran out first)
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
#   PYTHON            the python with CUDA torch; default the project's .venv/bin/python
#                     (scripts/setup.sh makes it) where it exists, else python3 (a GPU machine's)
#   JOBS              parallel build jobs, default nproc
#   DDP_PROOF_BUDGET  seconds from the start after which no CPU-test step starts and a running one
#                     is stopped (it is then SKIP, not FAIL), default 540; the GPU rows always run
# Exit status: 0 when every step that ran passed; summary.txt and report.md list each step either
# way (PASS, FAIL, or SKIP with the reason).
set -uo pipefail

started=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
deps_only=0 dry=0 gpu_rows=1
case "${1:-}" in
  --deps-only) deps_only=1 ;;
  --dry-run) dry=1 ;;
  --cpu-tests) gpu_rows=0 ;;
  "") ;;
  *) echo "gpu_proof: unknown argument '$1' (expected --deps-only, --dry-run or --cpu-tests)" >&2
     exit 2 ;;
esac
budget=${DDP_PROOF_BUDGET:-540}
[[ $budget =~ ^[0-9]+$ ]] ||
  { echo "gpu_proof: DDP_PROOF_BUDGET='$budget' is not a number of seconds" >&2; exit 2; }
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
default_python=python3
[ -x "$root/.venv/bin/python" ] && default_python=$root/.venv/bin/python
python=$(command -v "${PYTHON:-$default_python}" || echo "${PYTHON:-$default_python}")
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
# With `step_limit` set (seconds), COMMAND is stopped after that long and is SKIP, not FAIL.
step_limit=
step() {
  local name=$1 start status
  shift
  start=$(date +%s)
  echo "gpu_proof: running $name: $*"
  if [ -n "$step_limit" ]; then
    timeout "$step_limit" "$@" > "$out/$name.log" 2>&1
  else
    "$@" > "$out/$name.log" 2>&1
  fi
  status=$?
  if [ $status -eq 0 ]; then
    result[$name]="PASS ($(( $(date +%s) - start )) s)"
    log "PASS $name ($(( $(date +%s) - start )) s)"
  elif [ -n "$step_limit" ] && [ $status -eq 124 ]; then
    result[$name]="SKIP (stopped after $step_limit s: the time budget, DDP_PROOF_BUDGET=$budget s, ran out)"
    log "SKIP $name: ${result[$name]#SKIP }"
  else
    result[$name]="FAIL (exit $status; $name.log)"
    log "FAIL $name (exit $status, $(( $(date +%s) - start )) s; see $name.log)"
    tail -n 20 "$out/$name.log"
    failed=1
  fi
  return $status
}

# budgeted_step NAME COMMAND...: step() within what is left of DDP_PROOF_BUDGET; not started, and
# SKIP, when nothing is left (--cpu-tests then runs it alone).
budgeted_step() {
  local name=$1
  step_limit=$(( budget - ($(date +%s) - started) ))
  if [ $step_limit -le 0 ]; then
    result[$name]="SKIP (not started: the time budget, DDP_PROOF_BUDGET=$budget s, was spent)"
    log "SKIP $name: ${result[$name]#SKIP }"
    step_limit=
    return 1
  fi
  step "$@"
  local status=$?
  step_limit=
  return $status
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
# Sets mpirun, cmake_prefix, cmake_args, examples (OFF with a pre-C++11-ABI torch) and data (the
# Fashion-MNIST folder), and exports what an unpacked Open MPI needs.
. "$root/scripts/gpu_proof_deps.sh"

if [ $deps_only -eq 1 ]; then
  log "deps-only: done"
  exit $failed
fi

# --- Build --------------------------------------------------------------------------------------
configure_args=(-DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=ON -DDDP_BUILD_BENCH=$examples
  -DDDP_BUILD_EXAMPLES=$examples -DCMAKE_PREFIX_PATH="$cmake_prefix"
  -DDDP_PYTHON="$(command -v "$python")" ${nccl_root:+-DNCCL_ROOT="$nccl_root"} "${cmake_args[@]}")
# The GPU rows' targets first (the CPU tests' two, a third of the build, come after those rows).
gpu_targets=(gpu_tests nccl_timeout_probe)
[ $examples = ON ] && gpu_targets+=(mnist ddp_mnist ddp_cifar ddp_mnist_signal_at_step
                                    ddp_compare_models bench_throughput bench_data_path
                                    make_cifar_data)
cpu_targets=(unit_tests distributed_tests)
if [ $dry -eq 0 ]; then
  step configure cmake -S "$root" -B "$build" "${configure_args[@]}"
  if ! grep -q "building the NCCL communicator and the GPU tests" "$out/configure.log"; then
    log "FAIL configure: no CUDA LibTorch + NCCL communicator; its ddp: lines:"
    grep "ddp:" "$out/configure.log" | tee -a "$out/summary.txt"
    exit 1
  fi
  if [ $gpu_rows -eq 1 ]; then
    step build cmake --build "$build" -j "$jobs" --target "${gpu_targets[@]}" || exit 1
  fi
else
  # The real run's configure line, in a scratch tree (a CPU LibTorch has no GPU targets: the
  # dry run then looks only for the others), and the binaries of the tree the steps run from.
  step configure cmake -S "$root" -B "$scratch/configure-check" "${configure_args[@]}" || exit 1
  targets=("${gpu_targets[@]}" "${cpu_targets[@]}")
  grep -q "building the NCCL communicator and the GPU tests" "$out/configure.log" ||
    targets=("${targets[@]:2}")
  binaries=(tests/unit_tests tests/distributed_tests)
  [ $examples = ON ] && binaries+=(examples/mnist examples/ddp_mnist examples/ddp_cifar
                                   tests/ddp_mnist_signal_at_step tools/ddp_compare_models
                                   bench/bench_throughput bench/bench_data_path
                                   tests/make_cifar_data)
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
  device=cuda no_cuda=() limit=0 unit_filter='*' dist_filter='*' mnist_data=$data
  ctest_dist='^distributed_np'
  bench_steps=(--warmup-steps 50 --window-steps 500 --windows 5)
  # ResNet-18 with AMP: 100 steps of batch 128 in ddp_cifar; 3 windows of 100 in the benchmark.
  cifar_train=12800 cifar_test=1000 cifar_batch=128 cifar_limit=100
  amp_bench=(--model resnet18 --batch-size 128 --warmup-steps 20 --window-steps 100 --windows 3)
  data_path_calls=2000
else
  device=cpu no_cuda=(--no-cuda) limit=4 unit_filter='Bucketing*'
  # The training steps read 1024 training and 500 test images: evaluating all 10000 on a CPU
  # took most of the dry run.
  mnist_data=$scratch/mnist_subset
  mkdir -p "$mnist_data"
  /usr/bin/python3 "$root/tests/system/mnist_subset.py" "$data" "$mnist_data" 1024 500 || exit 1
  dist_filter='ReducerAtOneRank.*:SnapshotCudaGenerator.*' ctest_dist='^distributed_np1$'
  bench_steps=(--warmup-steps 2 --window-steps 3 --windows 1)
  # fp16 on a CPU is emulated (seconds per ResNet-18 step): two samples, two steps.
  cifar_train=8 cifar_test=4 cifar_batch=2 cifar_limit=2
  amp_bench=(--model resnet18 --batch-size 2 --warmup-steps 1 --window-steps 1 --windows 1)
  data_path_calls=20
fi

gpu_steps() {
  # -V: each GoogleTest line in the log, so the report's log names every test that ran.
  step gpu_tests bash -c "cd '$build' && ctest -L '^gpu\$' -V"
  # One GPU runs the NCCL Reducer only with DDPOptions::reducer_at_one_rank: its own row. The dry
  # run, with no GPU, runs the CPU side of it (the option at one rank equals a plain step).
  if [ $dry -eq 0 ]; then
    step nccl_reducer_one_rank env GTEST_FILTER='GpuDdp.NcclReducer*' \
      "$mpirun" -np 1 "$build/tests/gpu/gpu_tests"
  else
    step nccl_reducer_one_rank env GTEST_FILTER='ReducerAtOneRank.*' \
      "$mpirun" -np 1 "$build/tests/distributed_tests"
  fi
  [ $examples = ON ] || return 0

  step mnist_gpu "$build/examples/mnist" --epochs 1 --data-dir "$mnist_data" \
    --limit-train-batches $limit "${no_cuda[@]}"
  if ! grep -q "device $device" "$out/mnist_gpu.log" ||
     ! grep -q "Test set: Average loss" "$out/mnist_gpu.log"; then
    log "FAIL mnist_gpu: did not train on $device to a test result"
    result[mnist_gpu]="FAIL (not on $device to a test result)"
    failed=1
  fi
  # NCCL_DEBUG=INFO makes NCCL print its set-up, which shows the rank trained over NCCL.
  step ddp_mnist_nccl env NCCL_DEBUG=INFO "$mpirun" -np 1 "$build/examples/ddp_mnist" --epochs 1 \
    --data-dir "$mnist_data" --metrics-file "$out/ddp_mnist_metrics.jsonl" \
    --limit-train-batches $limit "${no_cuda[@]}"
  if [ $dry -eq 0 ] && ! grep -q "NCCL INFO" "$out/ddp_mnist_nccl.log"; then
    log "FAIL ddp_mnist_nccl: NCCL never started (did the rank get a GPU?)"
    result[ddp_mnist_nccl]="FAIL (NCCL never started)"
    failed=1
  fi
  # The data pipeline's share of mnist's step (the whole data set lives on the GPU).
  grep "^Epoch" "$out/mnist_gpu.log" | sed "s/^/mnist: /" | tee -a "$out/summary.txt"

  # A mid-epoch SIGTERM and --resume on the GPU, against the same run uninterrupted (2 epochs of
  # 6 steps, the signal after step 8, agreed at the boundary after step 9): the seed CNN's dropout
  # draws on the GPU, so the resumed model is bit-identical only if the snapshot restored the CUDA
  # generator too. The same run twice first: if those differ, the GPU's kernels are not
  # deterministic (cuDNN picks algorithms with atomics unless told otherwise), and a difference
  # after the resume says nothing about it.
  resume=$out/resume
  rm -rf "$resume"
  mnist_resume=(--data-dir "$mnist_data" --epochs 2 --batch-size 64 --limit-train-batches 6
                --test-batch-size 2000 --log-interval 0 --keep-checkpoints 0 --deterministic "${no_cuda[@]}")
  step resume_gpu bash -c "
    set -eo pipefail
    '$mpirun' -np 1 '$build/examples/ddp_mnist' ${mnist_resume[*]} --checkpoint-dir '$resume/full'
    '$mpirun' -np 1 '$build/examples/ddp_mnist' ${mnist_resume[*]} --checkpoint-dir '$resume/again'
    '$build/tools/ddp_compare_models' '$resume/full/model_with_epoch2.pt' \
      '$resume/again/model_with_epoch2.pt' ||
      { echo 'the same run twice differs: non-deterministic GPU kernels, not the resume'; exit 1; }
    status=0
    '$mpirun' -np 1 '$build/tests/ddp_mnist_signal_at_step' --signal-at-step=8:0:TERM \
      ${mnist_resume[*]} --checkpoint-dir '$resume/term' || status=\$?
    [ \$status -eq 75 ] || { echo \"the signalled run exited \$status, not 75\"; exit 1; }
    test -f '$resume/term/snapshot_epoch2_batch3.pt'
    '$mpirun' -np 1 '$build/examples/ddp_mnist' ${mnist_resume[*]} --checkpoint-dir '$resume/term' \
      --resume 2>&1 | tee '$resume/resumed.log'
    grep -q 'Resumed from .*snapshot_epoch2_batch3.pt' '$resume/resumed.log'
    if grep -q 'generator states' '$resume/resumed.log'; then exit 1; fi
    '$build/tools/ddp_compare_models' '$resume/full/model_with_epoch2.pt' \
      '$resume/term/model_with_epoch2.pt'"

  # ddp_cifar's ResNet-18 with mixed precision, through the Trainer and its data path (the data
  # set on the GPU, the crops and flips there): that it trains to a test result in bf16 and in
  # fp16 with the GradScaler, and what share of its step the data takes.
  cifar_data=$scratch/cifar_synthetic
  step cifar_amp bash -c "
    set -eo pipefail
    '$build/tests/make_cifar_data' '$cifar_data' --train $cifar_train --test $cifar_test
    for amp in bf16 fp16; do
      '$mpirun' -np 1 '$build/examples/ddp_cifar' --data-dir '$cifar_data' --model resnet18 \
        --amp \$amp --epochs 1 --batch-size $cifar_batch --limit-train-batches $cifar_limit \
        --test-batch-size $cifar_test --log-interval 0 ${no_cuda[*]} \
        --metrics-file '$out/cifar_amp_'\$amp'.jsonl' | tee '$out/cifar_amp_'\$amp'.log'
      grep -q 'Test set: Average loss' '$out/cifar_amp_'\$amp'.log'
    done"
  for amp in bf16 fp16; do
    grep -s "^Epoch" "$out/cifar_amp_$amp.log" | sed "s/^/ddp_cifar --amp $amp: /" |
      tee -a "$out/summary.txt"
  done

  # What each part of the data phase costs the host (its share above is the host's time); the
  # table is in data_path.log.
  step data_path "$build/bench/bench_data_path" $device 256 $data_path_calls

  # Training steps on this GPU, ddp (C++) against PyTorch DDP from this python, both at one rank
  # over NCCL, the same model, batch, precision and synthetic data: the seed CNN at batch 64 in
  # fp32, then ResNet-18 with AMP in bf16 and in fp16 with the GradScaler (ddp's and torch.amp's).
  jsonl=$out/throughput_gpu.jsonl
  rm -f "$jsonl"
  bench=(--model cnn --batch-size 64 "${bench_steps[@]}" --device $device --out "$jsonl")
  step throughput_ddp "$mpirun" -np 1 "$build/bench/bench_throughput" "${bench[@]}"
  step throughput_pytorch "$mpirun" -np 1 "$python" "$root/bench/pytorch_ddp.py" "${bench[@]}"
  local amp_args="${amp_bench[*]} --device $device --out '$jsonl'"
  step amp_throughput_ddp bash -c "for amp in bf16 fp16; do
    '$mpirun' -np 1 '$build/bench/bench_throughput' $amp_args --amp \$amp || exit; done"
  step amp_throughput_pytorch bash -c "for amp in bf16 fp16; do
    '$mpirun' -np 1 '$python' '$root/bench/pytorch_ddp.py' $amp_args --amp \$amp || exit; done"
  "$python" - "$jsonl" <<'EOF_PY' 2>&1 | tee -a "$out/summary.txt" > "$out/throughput.txt"
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
mib = lambda r: f", GPU memory peak {r['gpu_peak_mb']:.0f} MiB" if "gpu_peak_mb" in r else ""
for r in runs:
    print(f"gpu_proof: {r['impl']} {r['model']}: {r['samples_per_sec']:.0f} samples/s{mib(r)}")
by = {(r["model"], r.get("amp", "off"), r["impl"].startswith("pytorch")): r for r in runs}
for (model, amp, pytorch), r in by.items():
    if not pytorch and (model, amp, True) in by:
        pt = by[(model, amp, True)]
        print(f"gpu_proof: {model} amp {amp}: ddp / PyTorch DDP = "
              f"{r['samples_per_sec'] / pt['samples_per_sec']:.2f}x" +
              (f", GPU memory peak {r['gpu_peak_mb'] / pt['gpu_peak_mb']:.2f}x PyTorch's"
               if "gpu_peak_mb" in r and "gpu_peak_mb" in pt else ""))
EOF_PY
}
[ $gpu_rows -eq 1 ] && gpu_steps

# Last, the CPU tests (CI runs them too): built only now, and within what is left of the budget,
# so that the GPU rows come first (about 80 s of running and a third of the build on 16 cores).
# The tests that read Fashion-MNIST look in DDP_MNIST_DIR: here it may be the unpacked copy.
cpu_built=1
if [ $dry -eq 0 ]; then
  budgeted_step build_cpu_tests cmake --build "$build" -j "$jobs" --target "${cpu_targets[@]}" ||
    cpu_built=0
fi
if [ $cpu_built -eq 1 ]; then
  budgeted_step unit_tests env GTEST_FILTER="$unit_filter" DDP_MNIST_DIR="$data" \
    "$build/tests/unit_tests"
  # Several ranks share the GPU only on the CPU: NCCL cannot put two ranks on one GPU.
  budgeted_step distributed_tests_cpu env GTEST_FILTER="$dist_filter" DDP_MNIST_DIR="$data" \
    bash -c "cd '$build' && CUDA_VISIBLE_DEVICES= ctest -R '$ctest_dist' -j 3 --output-on-failure"
else
  result[unit_tests]="not run: build_cpu_tests ${result[build_cpu_tests]}"
  result[distributed_tests_cpu]=${result[unit_tests]}
fi

# --- The report ---------------------------------------------------------------------------------
# One row per step: what it proves. docs/gpu.md quotes these rows; the dry run checks it names
# every one.
rows=(
  "gpu_tests|ctest -L gpu: the NCCL communicator at one rank (every dtype and op, stream ordering, async all-reduce, barrier), DDP over NCCL equal to one process on the global batch, backward not waiting for the GPU, SyncBatchNorm over NCCL, the comm hooks (fp16, bf16, PowerSGD) on CUDA against the CPU, the optimizer stepped inside backward against the plain step, ZeroRedundancyOptimizer over NCCL's reduce_scatter/all_gather_into against the unsharded optimizer, the data path (gather, crop and flip, normalise) and the Trainer after its optimizer step not waiting for the GPU, and the NCCL watchdog ending a job stuck behind a 10 s kernel with a 1 s timeout"
  "nccl_reducer_one_rank|the NCCL Reducer at world size 1 (DDPOptions::reducer_at_one_rank: hooks, buckets, the all-reduce on the NCCL stream and its events, rebuild): equal to the CPU result within 1e-5, and bit for bit to plain GPU steps"
  "mnist_gpu|mnist, one epoch on the GPU, to a test result; its epoch line gives the data's share of the step"
  "ddp_mnist_nccl|ddp_mnist, one epoch on one rank over NCCL (NCCL_DEBUG=INFO shows NCCL starting)"
  "resume_gpu|a mid-epoch SIGTERM and --resume of ddp_mnist on the GPU (dropout on the GPU): the resumed model equals the uninterrupted one bit for bit, with the CUDA generator state from the snapshot (after two uninterrupted runs were equal: the kernels are deterministic)"
  "data_path|the host's time a call for each part of the data phase (the gather from the GPU and from host memory, RandomCropFlip, normalise, and mnist's and ddp_cifar's whole data phase) at batch 256, until the call returns and until the GPU is done (bench_data_path)"
  "throughput_ddp|the seed CNN at batch 64, one rank: ddp's samples/s (bench_throughput)"
  "throughput_pytorch|the same with PyTorch DDP over NCCL from the same python (bench/pytorch_ddp.py); the ratio below"
  "cifar_amp|ddp_cifar's ResNet-18 on synthetic CIFAR-format data, 100 steps of batch 128 with --amp bf16 and with --amp fp16 (the GradScaler), to a test result; its epoch lines give samples/s, the data's share of the step and the GPU memory peak"
  "amp_throughput_ddp|ResNet-18 at batch 128, one rank, autocast in bf16 and in fp16 with the GradScaler: ddp's samples/s and GPU memory peak (bench_throughput --amp)"
  "amp_throughput_pytorch|the same with PyTorch DDP (torch.autocast, torch.amp.GradScaler) from the same python; the ratios below"
  "unit_tests|the single-process tests, with the GPU visible (built and run last, within DDP_PROOF_BUDGET)"
  "distributed_tests_cpu|the multi-rank tests at 1, 2 and 4 ranks on the CPU (one GPU cannot hold several NCCL ranks)"
)
cannot=(
  "NCCL between GPUs: real all-reduce traffic (NVLink, PCIe, the network), its overlap with backward, and bucket order agreed across ranks"
  "the NCCL watchdog naming another rank that never arrived (one rank cannot be missing)"
  "SyncBatchNorm statistics over several GPUs, and DDP on GPUs against one process on the global batch with more than one replica"
  "scaling: samples/s at 2 to 8 GPUs against PyTorch DDP, and NCCL's bootstrap across hosts"
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
} > "$out/report.md"

if [ $dry -eq 1 ]; then
  # The budget's two ways to skip a step, neither a failure: no time left to start it, and the
  # time running out while it runs.
  was_failed=$failed budget_was=$budget
  budget=$(( $(date +%s) - started ))
  budgeted_step budget_spent true
  budget=$(( $(date +%s) - started + 1 ))
  budgeted_step budget_runs_out sleep 5
  budget=$budget_was
  if [[ ${result[budget_spent]} != "SKIP (not started"* ]] ||
     [[ ${result[budget_runs_out]} != "SKIP (stopped"* ]] || [ $failed -ne $was_failed ]; then
    log "FAIL budget: ${result[budget_spent]}; ${result[budget_runs_out]}"
    failed=1
  fi
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

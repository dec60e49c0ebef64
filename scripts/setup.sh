#!/usr/bin/env bash
# Installs what ddp needs to build, test and run its demo on Debian 12:
#   1. Debian's packages: compiler, CMake, Open MPI, Boost.Program_options, GoogleTest, zlib,
#      protobuf (TensorBoard's event files), Fashion-MNIST, Slurm (the launch tests' local cluster), python3-venv, matplotlib, clang
#      with libFuzzer (the fuzz targets), Doxygen (the API reference);
#   2. the project's own virtual environment (.venv, or $DDP_VENV) with the pinned PyTorch wheel
#      from PyPI (scripts/requirements.txt): its LibTorch, built with CUDA, is the one ddp compiles
#      against, its NCCL the one ddp's NCCL communicator uses, and its Python the reference the
#      tests and benchmarks compare with, version for version;
#   3. where the machine has no CUDA toolkit (nvcc) of LibTorch's CUDA version, NVIDIA's toolkit
#      wheels of that version into that environment (.venv/cuda), since a CUDA LibTorch's CMake
#      package needs one to configure even when no GPU will run.
# Idempotent: when everything is present it only checks (about a second).
# Usage: scripts/setup.sh            (as root, or with sudo available)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${DDP_VENV:-$root/.venv}
requirements=$root/scripts/requirements.txt

packages=(
  build-essential cmake ccache
  libopenmpi-dev openmpi-bin
  libboost-program-options-dev
  libgtest-dev
  zlib1g-dev
  libxxhash-dev
  nlohmann-json3-dev
  libprotobuf-dev protobuf-compiler  # TensorBoard's event files (the Reporter)
  dataset-fashion-mnist
  python3-venv             # the environment that holds the torch wheel
  python3-matplotlib       # scripts/plot_metrics.py and the benchmarks' plots
  slurm-wlm munge          # the local Slurm cluster the launch tests start (tests/cluster/)
  iproute2                 # network namespaces as hosts for the mpirun tests (tests/cluster/)
  clang libclang-rt-14-dev # libFuzzer and the sanitizers for the readers' fuzz targets (fuzz/)
  doxygen                  # the API reference of the core (target doc; checked by ctest)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
else
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The torch wheel, once per version: the stamp is the requirements file that was installed.
stamp=$venv/.ddp-requirements

# Disk: the environment takes 5.8 GB, a build with its tests' files about 6 GB. A disk that runs
# out shows up minutes later as a compiler's "No space left on device"; say it here first.
need_gb=6
[ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp" || need_gb=12
free_gb=$(df -P -BG "$root" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
if [ "${free_gb:-0}" -lt "$need_gb" ]; then
  echo "setup: warning: ${free_gb} GB free on the disk of $root; the environment, a build and" \
       "the tests need about $need_gb GB more" >&2
fi
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  echo "setup: $(grep -v '^#' "$requirements" | tr '\n' ' ')present in $venv"
else
  start=$(date +%s)
  echo "setup: installing $(grep -v '^#' "$requirements" | tr '\n' ' ')into $venv" \
       "(about 3 GB from PyPI, 5.8 GB installed)"
  # Debian's python3, not one that happens to be first on PATH: the wheel's ABI tag must match.
  /usr/bin/python3 -m venv "$venv"
  # --no-cache-dir: pip's cache would keep another 3 GB of wheels on a disk that can be small.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir -r "$requirements"
  cp "$requirements" "$stamp"
  echo "setup: torch installed in $(( $(date +%s) - start )) s"
fi

# A CUDA toolkit for the CUDA LibTorch's CMake package, of LibTorch's CUDA version: the
# machine's if it has that one (CUDA_HOME, CUDA_PATH, /usr/local/cuda, nvcc on PATH), else
# NVIDIA's wheels of that version in .venv/cuda, which the build then uses and hands on to the
# programs built against ddp (cmake/ddpCudaToolkit.cmake).
# "13.0": the release of the first of these nvcc programs that exists.
toolkit_version() {
  local nvcc
  for nvcc in "$@"; do
    if [ -x "$nvcc" ]; then
      "$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p'
      return
    fi
  done
}
torch_cuda=$("$venv/bin/python" -c 'import torch; print(torch.version.cuda or "")')
if [ -n "$torch_cuda" ]; then
  machine_cuda=$(toolkit_version "${CUDA_HOME:-/nonexistent}/bin/nvcc" \
    "${CUDA_PATH:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)")
  if [ "${DDP_PIP_CUDA_TOOLKIT:-0}" = 1 ] || [ "$machine_cuda" != "$torch_cuda" ]; then
    if [ "$(toolkit_version "$venv/cuda/bin/nvcc")" = "$torch_cuda" ]; then
      echo "setup: CUDA toolkit $torch_cuda (NVIDIA's wheels) present in $venv/cuda"
    else
      echo "setup: LibTorch uses CUDA $torch_cuda; this machine's toolkit:" \
           "${machine_cuda:-none}"
      "$root/scripts/pip_cuda_toolkit.sh" "$venv"
    fi
  fi
fi

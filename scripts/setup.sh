#!/usr/bin/env bash
# Installs what ddp needs to build, test and run its demo on Debian 12:
#   1. Debian's packages: compiler, CMake, Open MPI, Boost.Program_options, GoogleTest, zlib,
#      Fashion-MNIST, Slurm (the launch tests' local cluster), python3-venv, matplotlib, clang
#      with libFuzzer (the fuzz targets);
#   2. the project's own virtual environment (.venv, or $DDP_VENV) with the pinned PyTorch wheel
#      from PyPI (scripts/requirements.txt): its LibTorch, built with CUDA, is the one ddp compiles
#      against, its NCCL the one ddp's NCCL communicator uses, and its Python the reference the
#      tests and benchmarks compare with, version for version;
#   3. where the machine has no CUDA toolkit (nvcc), NVIDIA's toolkit wheels of the same CUDA
#      version into that environment (.venv/cuda), since a CUDA LibTorch's CMake package needs
#      one to configure even when no GPU will run.
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
  dataset-fashion-mnist
  python3-venv             # the environment that holds the torch wheel
  python3-matplotlib       # scripts/plot_metrics.py and the benchmarks' plots
  slurm-wlm munge          # the local Slurm cluster the launch tests start (tests/cluster/)
  iproute2                 # network namespaces as hosts for the mpirun tests (tests/cluster/)
  clang libclang-rt-14-dev # libFuzzer and the sanitizers for the readers' fuzz targets (fuzz/)
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
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  echo "setup: $(grep -v '^#' "$requirements" | tr '\n' ' ')present in $venv"
else
  start=$(date +%s)
  echo "setup: installing $(grep -v '^#' "$requirements" | tr '\n' ' ')into $venv" \
       "(about 3 GB from PyPI, 5.8 GB installed)"
  # Debian's python3, not one that happens to be first on PATH: the wheel's ABI tag must match.
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
  echo "setup: torch installed in $(( $(date +%s) - start )) s"
fi

# A CUDA toolkit for the CUDA LibTorch's CMake package: the machine's if it has one (CUDA_HOME,
# /usr/local/cuda, nvcc on PATH), else NVIDIA's wheels of the torch wheel's CUDA version.
have_toolkit() {
  [ -x "${CUDA_HOME:-/nonexistent}/bin/nvcc" ] || [ -x /usr/local/cuda/bin/nvcc ] ||
    command -v nvcc > /dev/null
}
if [ "${DDP_PIP_CUDA_TOOLKIT:-0}" = 1 ] || ! have_toolkit; then
  "$root/scripts/pip_cuda_toolkit.sh" "$venv"
fi

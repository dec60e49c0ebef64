#!/usr/bin/env bash
# Installs the Debian packages ddp needs to build, test and run its demo.
# Idempotent: when everything is present it only checks (well under a second).
# Usage: scripts/setup.sh            (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake
  libtorch-dev
  libopenblas0-openmp      # LibTorch's BLAS: Debian's default reference BLAS makes a CNN step 2x slower
  libopenmpi-dev openmpi-bin
  libboost-program-options-dev
  libgtest-dev
  zlib1g-dev
  dataset-fashion-mnist
  python3-torch            # reference implementation for the equivalence tests
  slurm-wlm munge          # the local Slurm cluster the launch tests start (tests/cluster/)
  iproute2                 # network namespaces as hosts for the mpirun tests (tests/cluster/)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

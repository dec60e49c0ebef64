#!/usr/bin/env bash
# A CUDA toolkit from NVIDIA's PyPI wheels, for machines that have none of LibTorch's CUDA version
# (a fresh Debian 12 has none at all).
#
# A CUDA LibTorch's CMake package runs enable_language(CUDA) and find_package(CUDAToolkit) even
# when nothing CUDA will run, so configuring ddp against the torch wheel needs nvcc, the CUDA
# headers and the libraries' link names. The torch wheel already brings the runtime libraries
# (NVIDIA's `cuda-toolkit` package, at the CUDA version torch was built with); this adds nvcc and
# the other parts of that same version, then lays them out as a toolkit in <venv>/cuda: bin/,
# include/ and nvvm/ point into the wheels, and lib64/ holds the unversioned names that CMake
# looks for (libcudart.so -> libcudart.so.13).
#
# Usage: scripts/pip_cuda_toolkit.sh VENV     (called by scripts/setup.sh)
set -euo pipefail
venv=${1:?usage: pip_cuda_toolkit.sh VENV}
python=$venv/bin/python

version=$("$python" -m pip show cuda-toolkit 2>/dev/null | sed -n 's/^Version: //p')
if [ -z "$version" ]; then
  echo "pip_cuda_toolkit: $venv has no cuda-toolkit package: is its torch a CUDA build?" >&2
  exit 1
fi
echo "pip_cuda_toolkit: installing NVIDIA's wheels of CUDA $version into $venv"
"$python" -m pip install -q --disable-pip-version-check --no-cache-dir \
  "cuda-toolkit[nvcc,crt,nvvm,cudart,cublas,curand,cufft,cusolver,cusparse,nvrtc,nvtx,nvjitlink]==$version"

site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
major=${version%%.*}
wheels=$site/nvidia/cu$major
[ -x "$wheels/bin/nvcc" ] || { echo "pip_cuda_toolkit: no nvcc in $wheels/bin" >&2; exit 1; }

toolkit=$venv/cuda
rm -rf "$toolkit"
mkdir -p "$toolkit/lib64"
for part in bin include nvvm; do ln -s "$wheels/$part" "$toolkit/$part"; done
# nvcc.profile looks for the libraries in lib/ beside bin/; CMake looks in lib64/ too.
ln -s lib64 "$toolkit/lib"
for lib in "$wheels"/lib/*.so.* "$wheels"/lib/*.a; do
  name=$(basename "$lib")
  ln -sf "$lib" "$toolkit/lib64/$name"
  case $name in *.so.*) ln -sf "$name" "$toolkit/lib64/${name%%.so.*}.so" ;; esac
done
echo "pip_cuda_toolkit: CUDA toolkit $("$toolkit/bin/nvcc" --version | tail -n 1) in $toolkit"

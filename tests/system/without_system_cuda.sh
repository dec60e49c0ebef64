#!/bin/sh
# Runs a command as on a machine without a CUDA toolkit of its own (a fresh Debian 12), so that
# the tests of the installed package see what a user there sees: in a private mount namespace,
# every /usr/local/cuda* folder is covered by an empty tmpfs, every nvcc on PATH or in CMake's
# default folders by an empty file, and CUDA_HOME, CUDA_PATH, CUDACXX and CUDAToolkit_ROOT are
# unset. Only the toolkit that ddp's own build configured with stays visible (for ddp built
# in this checkout: NVIDIA's wheels in .venv/cuda, from scripts/setup.sh).
#
# Usage: without_system_cuda.sh COMMAND [ARG...]
# On a machine that has no system toolkit (a fresh Debian 12 itself) there is nothing to hide:
# the command runs with those variables unset. Otherwise hiding needs root and a mount namespace;
# where either is missing it prints why and exits 77 (ctest: skipped).
unset CUDA_HOME CUDA_PATH CUDACXX CUDAToolkit_ROOT
nothing_to_hide=1
[ "${DDP_IN_PRIVATE_MOUNTS:-}" = 1 ] && nothing_to_hide=0  # looked already, before the namespace
for dir in /usr/local/cuda*; do
  if [ -d "$dir" ] && [ ! -L "$dir" ]; then nothing_to_hide=0; fi
done
if [ "$nothing_to_hide" = 1 ] && { command -v nvcc > /dev/null || [ -x /usr/local/bin/nvcc ] ||
   [ -x /usr/bin/nvcc ] || [ -x /opt/cuda/bin/nvcc ]; }; then
  nothing_to_hide=0
fi
if [ "$nothing_to_hide" = 1 ]; then
  echo "without_system_cuda: this machine has no system CUDA toolkit; nothing to hide"
  exec "$@"
fi
if [ "$(id -u)" != 0 ]; then
  echo "skipped: hiding the system CUDA toolkit needs root (a private mount namespace)"
  exit 77
fi
if [ "${DDP_IN_PRIVATE_MOUNTS:-}" != 1 ]; then
  if ! unshare --mount --propagation private true 2> /dev/null; then
    echo "skipped: no private mount namespace here (unshare --mount fails, e.g. in a chroot)," \
      "so the system CUDA toolkit cannot be hidden"
    exit 77
  fi
  DDP_IN_PRIVATE_MOUNTS=1 exec unshare --mount --propagation private "$0" "$@"
fi
for dir in /usr/local/cuda*; do
  if [ -d "$dir" ] && [ ! -L "$dir" ]; then
    mount -t tmpfs -o size=1m ddp-no-cuda "$dir" || exit 1
    echo "without_system_cuda: hid $dir"
  fi
done
# An nvcc (or a wrapper of one) on PATH or where CMake looks by default: covered by an empty file
# that is not executable.
blank=$(mktemp)
old_ifs=$IFS
IFS=:
for dir in $PATH /usr/local/bin /usr/bin /opt/cuda/bin; do
  if [ -x "$dir/nvcc" ]; then
    mount --bind "$blank" "$dir/nvcc" || exit 1
    echo "without_system_cuda: hid $dir/nvcc"
  fi
done
IFS=$old_ifs
rm -f "$blank"  # the mounts keep it
unset DDP_IN_PRIVATE_MOUNTS
hash -r  # forget any nvcc looked up before the mounts
if command -v nvcc > /dev/null; then
  echo "without_system_cuda: nvcc is still visible: $(command -v nvcc)" >&2
  exit 1
fi
exec "$@"

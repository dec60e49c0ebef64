#!/usr/bin/env bash
# Downloads into .debs/ (git-ignored) the Debian 12 packages that scripts/gpu_proof.sh unpacks on
# a GPU machine that lacks them and has no internet: Open MPI (mpirun, headers, libmpi and the
# libraries it loads), Boost.Program_options, GoogleTest's sources, zlib, xxHash, nlohmann-json and Fashion-MNIST.
# Run it here (apt must reach its mirrors), then take the repository with .debs/ to the GPU
# machine. Usage: scripts/fetch_gpu_debs.sh
#
# One folder per component, so gpu_proof.sh unpacks only what the machine is missing. A
# component is the Depends closure (apt-cache depends, recursive) of its runtime packages, minus
# what every Debian or Ubuntu system has (libc6, libstdc++6, ...; see `base` below) and two
# subtrees a one-node run never loads (openssh-client: mpirun's remote start; libhwloc-plugins:
# optional hwloc plugins that pull in X11 and OpenCL), plus its -dev packages without their
# build dependencies (the headers, CMake files and compiler wrappers are all that is needed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/.debs

declare -A runtime_roots=(
  [mpi]="openmpi-bin openmpi-common libopenmpi3"
  [boost]="libboost-program-options1.74.0"
  [gtest]=""
  [zlib]="zlib1g"
  [xxhash]="libxxhash0"
  [json]=""
  [data]=""
)
declare -A without_deps=(
  [mpi]="libopenmpi-dev"
  [boost]="libboost-program-options1.74-dev libboost1.74-dev"
  [gtest]="googletest"  # sources: gpu_proof.sh builds them with the compiler and ABI of torch
  [zlib]="zlib1g-dev"
  [xxhash]="libxxhash-dev"
  [json]="nlohmann-json3-dev"
  [data]="dataset-fashion-mnist"
)
base=(libc6 libgcc-s1 gcc-12-base libstdc++6 zlib1g libudev1 libuuid1 openssh-client
      libhwloc-plugins)

# Required and important packages are in every installation too.
is_base() {
  local package=$1 priority
  if [[ " ${base[*]} " == *" $package "* ]]; then return 0; fi
  priority=$(apt-cache show --no-all-versions "$package" 2>/dev/null |
             awk '/^Priority:/ {print $2; exit}')
  [[ $priority == required || $priority == important ]]
}

# The Depends closure of the given packages, without base packages and their subtrees.
closure() {
  local -A seen=()
  local queue=("$@") package dep
  local result=()
  while ((${#queue[@]})); do
    package=${queue[0]}
    queue=("${queue[@]:1}")
    [[ -n ${seen[$package]:-} ]] && continue
    seen[$package]=1
    # A root is kept even when it is a base package elsewhere (zlib1g for the zlib component).
    if [[ " $* " != *" $package "* ]] && is_base "$package"; then continue; fi
    result+=("$package")
    for dep in $(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
                   --no-replaces --no-enhances "$package" |
                 awk '$1 ~ /Depends:$/ && $2 !~ /^</ {print $2}'); do
      queue+=("$dep")
    done
  done
  printf '%s\n' "${result[@]}"
}

for component in mpi boost gtest zlib xxhash json data; do
  # shellcheck disable=SC2086  # word splitting of the package lists is intended
  mapfile -t packages < <({ [ -n "${runtime_roots[$component]}" ] &&
                              closure ${runtime_roots[$component]};
                            printf '%s\n' ${without_deps[$component]}; } | sort -u)
  mkdir -p "$out/$component"
  rm -f "$out/$component"/*.deb
  echo "fetch_gpu_debs: $component: ${packages[*]}"
  (cd "$out/$component" && apt-get download -q "${packages[@]}")
done
{
  echo "# Fetched $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  for deb in "$out"/*/*.deb; do
    echo "${deb#"$out"/} $(dpkg-deb -f "$deb" Version)"
  done
} > "$out/MANIFEST"
echo "fetch_gpu_debs: $(grep -vc '^#' "$out/MANIFEST") packages," \
     "$(du -sh "$out" | cut -f1) in $out (listed in $out/MANIFEST)"

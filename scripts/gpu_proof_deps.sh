# Sourced by scripts/gpu_proof.sh (not run alone): the dependencies a GPU machine may lack (Open
# MPI, Boost.Program_options, zlib, xxHash, nlohmann-json, GoogleTest, Fashion-MNIST), taken from
# the machine where it has them, else unpacked with `dpkg -x` from .debs/ (which
# scripts/fetch_gpu_debs.sh fills on a Debian 12 machine with apt). Uses gpu_proof.sh's step, log,
# python, prefix, scratch, jobs, abi, torch_prefix and deps_only; sets mpirun, cmake_prefix,
# cmake_args, examples and data, and exports PATH, LD_LIBRARY_PATH and Open MPI's locations when
# it unpacks MPI. DDP_PROOF_UNPACK=all unpacks even what the machine has.

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


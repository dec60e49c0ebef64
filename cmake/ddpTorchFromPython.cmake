# Where LibTorch comes from when the user names none.
#
# scripts/setup.sh installs a pinned torch wheel (CUDA build) in the project's virtual
# environment, .venv. That wheel's LibTorch is the tested build, its NCCL is the one torch itself
# loads, and its Python is the reference the tests and benchmarks compare against. So a plain
# `cmake -S . -B build` uses it. A user who brings their own LibTorch (the official archive, say)
# names it with Torch_DIR or CMAKE_PREFIX_PATH, and then nothing here touches the search.
#
# Sets (cache):  DDP_PYTHON   the Python with torch for the reference tests and benchmarks
# Sets (normal): DDP_TORCH_SOURCE   DDP_PYTHON, "Torch_DIR", "CMAKE_PREFIX_PATH (...)" or "none"
# May append to CMAKE_PREFIX_PATH, and point the CUDA toolkit search at .venv/cuda (below).
# Defines ddp_use_torch_wheel_libraries() (below), for after find_package(Torch).

set(DDP_VENV "${PROJECT_SOURCE_DIR}/.venv" CACHE PATH
    "The project's virtual environment (scripts/setup.sh): its torch is the default LibTorch")
if(EXISTS "${DDP_VENV}/bin/python")
  set(_ddp_default_python "${DDP_VENV}/bin/python")
else()
  find_program(_ddp_default_python NAMES python3 NO_CACHE)
endif()
set(DDP_PYTHON "${_ddp_default_python}" CACHE FILEPATH
    "Python with torch: the reference of the tests and benchmarks, and the default LibTorch")

# The torch of DDP_PYTHON, if it has one.
set(_ddp_torch_root "")
if(DDP_PYTHON)
  execute_process(
    COMMAND "${DDP_PYTHON}" -c
      "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _ddp_out ERROR_QUIET RESULT_VARIABLE _ddp_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_ddp_rc EQUAL 0)
    string(REPLACE "\n" ";" _ddp_out "${_ddp_out}")
    list(GET _ddp_out 0 _ddp_torch_root)
    list(GET _ddp_out 1 _ddp_torch_cmake)
  endif()
endif()

# Does the user already point at another LibTorch? (A Torch_DIR cached by an earlier configure
# that used DDP_PYTHON's torch is not the user's.)
set(_ddp_user_torch "")
if(DEFINED ENV{Torch_DIR}
   OR (DEFINED Torch_DIR AND NOT (_ddp_torch_root AND Torch_DIR STREQUAL "${_ddp_torch_cmake}/Torch")))
  set(_ddp_user_torch "Torch_DIR")
else()
  string(REPLACE ":" ";" _ddp_env_prefixes "$ENV{CMAKE_PREFIX_PATH}")
  foreach(_prefix IN LISTS CMAKE_PREFIX_PATH _ddp_env_prefixes)
    foreach(_suffix Torch share/cmake/Torch lib/cmake/Torch)
      if(EXISTS "${_prefix}/${_suffix}/TorchConfig.cmake")
        set(_ddp_user_torch "CMAKE_PREFIX_PATH (${_prefix})")
      endif()
    endforeach()
  endforeach()
endif()

set(DDP_TORCH_SOURCE "none")
if(_ddp_user_torch)
  set(DDP_TORCH_SOURCE "${_ddp_user_torch}")
elseif(_ddp_torch_root)
  # The torch folder itself first: its lib/ then comes before the system's library folders,
  # so TorchConfig's find_library calls cannot pick up another LibTorch installed in /usr.
  list(APPEND CMAKE_PREFIX_PATH "${_ddp_torch_root}" "${_ddp_torch_cmake}")
  set(DDP_TORCH_SOURCE "${DDP_PYTHON}")
endif()

# A CUDA LibTorch's package needs a CUDA toolkit to configure (cmake/ddpCudaToolkit.cmake).
# Where the machine has none of LibTorch's CUDA version, scripts/setup.sh lays out NVIDIA's
# toolkit wheels of that version as .venv/cuda (scripts/pip_cuda_toolkit.sh): then ddp builds
# with that one unless the configure names another, and its package config records it for the
# programs built against ddp (DDP_CUDA_TOOLKIT_ROOT in framework/CMakeLists.txt).
include(ddpCudaToolkit)
if(EXISTS "${DDP_VENV}/cuda/bin/nvcc")
  ddp_cuda_toolkit_named(_ddp_toolkit_named "${DDP_VENV}/cuda" SEARCHED_IS_NOT_NAMED)
  if(NOT _ddp_toolkit_named)
    ddp_use_cuda_toolkit("${DDP_VENV}/cuda")
    message(STATUS "ddp: CUDA toolkit: NVIDIA's wheels of LibTorch's CUDA version in ${DDP_VENV}/cuda")
  endif()
endif()

# ddp_use_torch_wheel_libraries(), after find_package(Torch) and, with CUDA, CUDAToolkit: a pip
# wheel's LibTorch loads the CUDA runtime and NCCL of the wheels beside it (nvidia/cu13/lib,
# nvidia/nccl). ddp uses the same ones, so a process has one of each:
#  - DDP_TORCH_CUDART is set to the wheel's libcudart.so.N, and CUDA::cudart (which LibTorch's
#    targets link too) points at it instead of the toolkit's, which may be older;
#  - NCCL_ROOT is set to the wheel's NCCL unless NCCL_ROOT (variable or environment) is given.
# With another LibTorch (an archive, a CPU build) it changes nothing.
macro(ddp_use_torch_wheel_libraries)
  set(DDP_TORCH_CUDART "")
  if(DDP_WITH_CUDA)
    file(GLOB _ddp_wheel_cudart "${TORCH_INSTALL_PREFIX}/../nvidia/cu*/lib/libcudart.so.*")
    if(_ddp_wheel_cudart)
      list(SORT _ddp_wheel_cudart)
      list(GET _ddp_wheel_cudart -1 DDP_TORCH_CUDART)
      get_filename_component(DDP_TORCH_CUDART "${DDP_TORCH_CUDART}" REALPATH)
      set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${DDP_TORCH_CUDART}")
    endif()
  endif()
  if(NOT DEFINED NCCL_ROOT AND NOT DEFINED ENV{NCCL_ROOT}
     AND EXISTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include/nccl.h")
    get_filename_component(NCCL_ROOT "${TORCH_INSTALL_PREFIX}/../nvidia/nccl" ABSOLUTE)
  endif()
endmacro()

# Which CUDA toolkit a CUDA LibTorch's CMake package configures with.
#
# That package (Caffe2's public/cuda.cmake) runs FindCUDA, enable_language(CUDA) and
# find_package(CUDAToolkit) whenever LibTorch was built with CUDA, even where no GPU will ever
# run, so every project that finds such a LibTorch needs a toolkit to configure: ddp's own build
# (cmake/ddpTorchFromPython.cmake) and every find_package(ddp) of a user (ddpConfig.cmake, which
# installs this file beside itself). Where the machine has no toolkit of LibTorch's CUDA version,
# scripts/setup.sh lays out NVIDIA's toolkit wheels as one in .venv/cuda; ddp builds with it and
# its package config hands the same toolkit on to the programs built against it.
#
# ddp_cuda_toolkit_named(<out> <ours> [SEARCHED_IS_NOT_NAMED]): <out> is TRUE when the project
#   names a toolkit itself: one of the CMake variables CUDA_TOOLKIT_ROOT_DIR (FindCUDA's),
#   CUDAToolkit_ROOT or CMAKE_CUDA_COMPILER, or the environment variables CUDAToolkit_ROOT,
#   CUDA_TOOLKIT_ROOT or CUDACXX. Values cached as <ours> by an earlier configure are not a choice.
#   Values that FindCUDA and enable_language(CUDA) cached on an earlier configure count as the
#   project's (its build directory works with them) unless SEARCHED_IS_NOT_NAMED: ddp's own build
#   moves such a directory to <ours> (CMake then re-runs the configure once, for the compiler).
#   CUDA_HOME and CUDA_PATH are not a choice: they say where a machine's toolkit lives, whatever
#   its version.
# ddp_use_cuda_toolkit(<root>): points FindCUDA, enable_language(CUDA) and CUDAToolkit at the
#   toolkit in <root> (which has bin/nvcc).

function(ddp_cuda_toolkit_named out ours)
  set(named FALSE)
  # FindCUDA caches what its own search found with this help string.
  get_property(help CACHE CUDA_TOOLKIT_ROOT_DIR PROPERTY HELPSTRING)
  set(searched FALSE)
  if(help STREQUAL "Toolkit location.")
    set(searched TRUE)
  endif()
  if(DEFINED CUDA_TOOLKIT_ROOT_DIR AND NOT CUDA_TOOLKIT_ROOT_DIR STREQUAL "${ours}"
     AND NOT ("${ARGN}" STREQUAL "SEARCHED_IS_NOT_NAMED" AND searched))
    set(named TRUE)
  endif()
  # A compiler named without a toolkit root (on a first configure: afterwards FindCUDA has
  # cached the root it derived from it).
  if(DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED CUDA_TOOLKIT_ROOT_DIR
     AND NOT CMAKE_CUDA_COMPILER STREQUAL "${ours}/bin/nvcc")
    set(named TRUE)
  endif()
  if(DEFINED CUDAToolkit_ROOT OR DEFINED ENV{CUDAToolkit_ROOT} OR DEFINED ENV{CUDA_TOOLKIT_ROOT}
     OR DEFINED ENV{CUDACXX})
    set(named TRUE)
  endif()
  set(${out} ${named} PARENT_SCOPE)
endfunction()

macro(ddp_use_cuda_toolkit root)
  set(CUDAToolkit_ROOT "${root}")
  set(CUDA_TOOLKIT_ROOT_DIR "${root}" CACHE PATH "CUDA toolkit (the one ddp was built with)" FORCE)
  set(CMAKE_CUDA_COMPILER "${root}/bin/nvcc" CACHE FILEPATH "nvcc (the one ddp was built with)"
      FORCE)
  # FindCUDA reads CUDA_PATH before its own defaults; this configure uses `root` throughout.
  set(ENV{CUDA_PATH} "${root}")
  set(ENV{CUDA_HOME} "${root}")
endmacro()

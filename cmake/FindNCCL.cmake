# Finds NCCL: in NCCL_ROOT (variable or environment) alone when one is given, else CUDA_HOME,
# then /usr/local/cuda, then the system. Header and library come from the same place, so a
# program does not compile against one NCCL and load another.
# Defines NCCL_FOUND, NCCL_VERSION and the imported target NCCL::NCCL.
set(_nccl_root ${NCCL_ROOT} $ENV{NCCL_ROOT})
if(_nccl_root)
  set(_nccl_where HINTS ${_nccl_root} NO_DEFAULT_PATH)
else()
  set(_nccl_where HINTS $ENV{CUDA_HOME} /usr/local/cuda)
endif()
find_path(NCCL_INCLUDE_DIR nccl.h ${_nccl_where} PATH_SUFFIXES include)
# pip's nvidia-nccl package (the NCCL inside a pip-installed torch) has only libnccl.so.2.
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR ${_nccl_where}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
# nccl.h includes cuda_runtime.h.
find_path(NCCL_CUDA_INCLUDE_DIR cuda_runtime.h
          HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_nccl_root} $ENV{CUDA_HOME} /usr/local/cuda
          PATH_SUFFIXES include)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} +([0-9]+).*" "\\1" _nccl_${_part}
           "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR NCCL_CUDA_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR};${NCCL_CUDA_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY NCCL_CUDA_INCLUDE_DIR)

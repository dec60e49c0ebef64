# CUDA detection and the compile-only check of the CUDA sources, for ddp's own build (not
# installed).

# ddp_torch_has_cuda(<var>): sets <var> to TRUE when the LibTorch that find_package(Torch) found
# was built with CUDA. Its package then defines the targets torch_cuda and c10_cuda (pip's torch)
# or TORCH_CUDA_LIBRARIES (older LibTorch packages); Debian's CPU LibTorch defines none of them.
function(ddp_torch_has_cuda out)
  if(TARGET torch_cuda OR TARGET c10_cuda OR TORCH_CUDA_LIBRARIES)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# ddp_cuda_compile_only(<target>): makes OBJECT library <target> compile CUDA sources against a
# CPU LibTorch whose package still ships the c10/cuda and ATen/cuda headers. Nothing is linked:
# there is no libc10_cuda to link. Those headers include a generated cuda_cmake_macros.h that a
# CPU package lacks, and C10_USING_CUSTOM_GENERATED_MACROS skips it. <target> sees a config.h
# that says DDP_WITH_CUDA and DDP_WITH_NCCL, so the CUDA branches of shared sources compile too.
function(ddp_cuda_compile_only target)
  set(dir ${PROJECT_BINARY_DIR}/cuda_compile_check/include)
  set(DDP_WITH_CUDA_01 1)
  set(DDP_WITH_NCCL_01 1)
  configure_file(${PROJECT_SOURCE_DIR}/framework/include/ddp/config.h.in ${dir}/ddp/config.h
                 @ONLY)
  target_include_directories(${target} BEFORE PRIVATE ${dir})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/framework/include
                                               ${PROJECT_SOURCE_DIR}/framework/src)
  target_compile_definitions(${target} PRIVATE C10_USING_CUSTOM_GENERATED_MACROS)
  target_compile_features(${target} PRIVATE cxx_std_17)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  # Usage requirements only (include directories, flags): an OBJECT library links nothing.
  target_link_libraries(${target} PRIVATE torch MPI::MPI_CXX NCCL::NCCL)
endfunction()

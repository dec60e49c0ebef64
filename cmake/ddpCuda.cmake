# ddp_torch_has_cuda(<var>): sets <var> to TRUE when the LibTorch that find_package(Torch) found
# was built with CUDA. Its package then defines the targets torch_cuda and c10_cuda (pip's torch,
# the official archives) or TORCH_CUDA_LIBRARIES (older LibTorch packages); a CPU LibTorch
# defines none of them.
function(ddp_torch_has_cuda out)
  if(TARGET torch_cuda OR TARGET c10_cuda OR TORCH_CUDA_LIBRARIES)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

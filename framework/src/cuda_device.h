#pragma once
// The CUDA runtime calls the Runtime makes, in a source compiled only with a CUDA LibTorch, so
// that runtime.cpp also builds against a CPU one. `rank` names the caller in errors.

#include <string>

namespace ddp::detail {

// Makes CUDA device `index` current for the calling thread (LibTorch asks the CUDA runtime for
// it), so that what is allocated next lands there and not on GPU 0.
void set_current_cuda_device(int index, int rank);

// The UUID of visible CUDA device `index`, in hex: the same in every process that sees that GPU,
// however CUDA_VISIBLE_DEVICES numbers it there.
std::string cuda_device_uuid(int index, int rank);

}  // namespace ddp::detail

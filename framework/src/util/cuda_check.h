#pragma once
// The one check for CUDA runtime calls: on failure, throws std::runtime_error with the world
// rank, the host, file:line, the call and CUDA's error name and string.

#include "util/host_name.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace ddp::detail {

inline void cuda_check(cudaError_t code, const char* call, const char* file, int line, int rank) {
  if (code == cudaSuccess) return;
  throw std::runtime_error(rank_and_host(rank) + ": " + file + ":" + std::to_string(line) + ": " +
                           call + " failed: " + cudaGetErrorName(code) + ": " +
                           cudaGetErrorString(code));
}

}  // namespace ddp::detail

#define DDP_CUDA_CHECK(call, rank) \
  ::ddp::detail::cuda_check((call), #call, __FILE__, __LINE__, (rank))

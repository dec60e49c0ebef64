#include "cuda_device.h"

#include "cuda_check.h"

#include <cuda_runtime_api.h>

#include <cstdio>

namespace ddp::detail {

void set_current_cuda_device(int index, int rank) {
  DDP_CUDA_CHECK(cudaSetDevice(index), rank);
}

std::string cuda_device_uuid(int index, int rank) {
  cudaDeviceProp properties{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&properties, index), rank);
  std::string hex;
  for (char byte : properties.uuid.bytes) {
    char digits[3];
    std::snprintf(digits, sizeof(digits), "%02x", static_cast<unsigned char>(byte));
    hex += digits;
  }
  return hex;
}

}  // namespace ddp::detail

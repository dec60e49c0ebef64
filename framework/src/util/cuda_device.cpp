#include "util/cuda_device.h"

#include "util/cuda_check.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <cstdio>
#include <vector>

namespace ddp::detail {

void set_current_cuda_device(int index, int rank) { DDP_CUDA_CHECK(cudaSetDevice(index), rank); }

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

int64_t cuda_free_bytes(int index, int rank) {
  // cudaMemGetInfo reports on the current device.
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
  size_t free = 0, total = 0;
  DDP_CUDA_CHECK(cudaMemGetInfo(&free, &total), rank);
  return static_cast<int64_t>(free);
}

int64_t cuda_memory_peak_bytes(int index) {
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  // [0] is StatType::AGGREGATE (every pool) in every LibTorch; the enum's namespace has moved.
  return stats.allocated_bytes[0].peak;
}

void reset_cuda_memory_peak(int index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

torch::Tensor copy_to_device_async(const torch::Tensor& host, torch::Device device) {
  // Only a copy from pinned memory leaves the host free; from pageable memory CUDA stages it
  // through a buffer of its own, synchronously.
  const torch::Tensor pinned = host.is_pinned() ? host : host.pin_memory();
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  torch::Tensor copy;
  {
    // Allocated on the side stream too: memory the caching allocator hands out for the current
    // stream may still be read by kernels queued there, which the copy does not wait for.
    const c10::cuda::CUDAStreamGuard on_side(side);
    // LibTorch keeps the pinned buffer from reuse until the copy is done (an event of its host
    // allocator), so `pinned` may go out of scope now.
    copy = pinned.to(device, /*non_blocking=*/true);
  }
  at::cuda::CUDAEvent copied;
  copied.record(side);
  copied.block(current);
  // The memory belongs to the side stream; without this, freeing `copy` would let the side
  // stream reuse it while kernels on the current stream still read it.
  c10::cuda::CUDACachingAllocator::recordStream(copy.storage().data_ptr(), current);
  return copy;
}

torch::Tensor gather_to_device_async(const torch::Tensor& host, const torch::Tensor& index,
                                     torch::Device device) {
  std::vector<int64_t> shape = host.sizes().vec();
  shape[0] = index.size(0);
  torch::Tensor pinned = torch::empty(shape, host.options().pinned_memory(true));
  torch::index_select_out(pinned, host, 0, index);
  return copy_to_device_async(pinned, device);
}

}  // namespace ddp::detail

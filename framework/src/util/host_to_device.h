#pragma once
// A host tensor copied to `device` without the host waiting for the device. A plain
// `host.to(cuda)` from pageable memory synchronizes the current stream first (ATen's copy waits
// for the copy to finish), so the host would wait for every kernel already queued there, and a
// data phase that made its small index or constant tensors that way would time the previous
// step's GPU work. On a GPU this stages through pinned memory and copies on a side stream
// (copy_to_device_async in cuda_device.h); on the CPU it is host.to(device).

#include <ddp/config.h>
#if DDP_WITH_CUDA
#include "util/cuda_device.h"
#endif

#include <torch/types.h>

namespace ddp::detail {

inline torch::Tensor to_device_without_waiting(const torch::Tensor& host, torch::Device device) {
#if DDP_WITH_CUDA
  if (device.is_cuda() && host.is_cpu()) return copy_to_device_async(host, device);
#endif
  return host.to(device);
}

}  // namespace ddp::detail

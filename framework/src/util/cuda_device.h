#pragma once
// The CUDA runtime calls the Runtime and the data sets make, in a source compiled only with a
// CUDA LibTorch, so that their sources also build against a CPU one. `rank` names the caller in
// errors.

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace ddp::detail {

// Makes CUDA device `index` current for the calling thread (LibTorch asks the CUDA runtime for
// it), so that what is allocated next lands there and not on GPU 0.
void set_current_cuda_device(int index, int rank);

// The UUID of visible CUDA device `index`, in hex: the same in every process that sees that GPU,
// however CUDA_VISIBLE_DEVICES numbers it there.
std::string cuda_device_uuid(int index, int rank);

// Bytes free on CUDA device `index` now (cudaMemGetInfo).
int64_t cuda_free_bytes(int index, int rank);

// The most bytes tensors held at once on CUDA device `index` in this process since the last
// reset_cuda_memory_peak (the caching allocator's count: PyTorch's torch.cuda.max_memory_allocated
// and torch.cuda.reset_peak_memory_stats).
int64_t cuda_memory_peak_bytes(int index);
void reset_cuda_memory_peak(int index);

// `host` (a CPU tensor) copied to CUDA `device` without the host waiting: staged in pinned memory
// (unless it is pinned already) and copied on a side stream, which the current stream waits for
// through an event. The copy thus overlaps the kernels queued before it, and whatever is queued
// on the current stream afterwards sees the data.
torch::Tensor copy_to_device_async(const torch::Tensor& host, torch::Device device);

// host.index_select(0, index) gathered on the host straight into pinned memory, then
// copy_to_device_async() to `device`. `index`: int64 on the CPU.
torch::Tensor gather_to_device_async(const torch::Tensor& host, const torch::Tensor& index,
                                     torch::Device device);

}  // namespace ddp::detail

#pragma once
// Refusing a batch that cannot fit in host memory before training starts, with the numbers,
// rather than being killed by the kernel's OOM killer minutes later with no word from ddp.
//
// The estimate is a lower bound, so a batch that would fit is never refused: the batch's pixels
// plus what forward keeps alive for backward, measured by one forward of a few samples. Host
// memory only: on a GPU the batch lives in the device's memory.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp {

struct HostMemory {
  uint64_t available_bytes = 0;
  std::string source;  // where the figure comes from, for messages
};

// MemAvailable from /proc/meminfo, lowered to the limit minus the usage of the process's cgroup
// when that sets a limit (cgroup v2 memory.max / memory.current, or v1 memory.limit_in_bytes /
// memory.usage_in_bytes). `root` prefixes every path read (tests point it at a fake tree).
// Throws std::runtime_error when /proc/meminfo cannot be read.
HostMemory host_memory_available(const std::string& root = "");

// Bytes of host memory one training sample of shape `sample_shape` (e.g. {1, 28, 28}) needs at
// least in a training step of `model` run by `forward`: 5 bytes per pixel (uint8 + float32), plus
// what forward keeps for backward, measured with glibc's allocator statistics (mallinfo2) around
// one forward of `probe_samples` zero samples in eval mode (no dropout draw, no BatchNorm
// statistics change, nothing communicated); the model's mode is restored. `model` must be on
// the CPU.
uint64_t training_bytes_per_sample(
    torch::nn::Module& model, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const std::vector<int64_t>& sample_shape, int64_t probe_samples = 4);

// Throws std::runtime_error when `ranks_on_node` ranks of `batch_size` samples of
// `bytes_per_sample` each need more than `memory.available_bytes`. The message starts with
// `option` (what set the batch size, with its value: "--batch-size 1000000000"), then gives the
// estimate, what it covers, the memory available and where that figure comes from.
void require_batch_fits(const std::string& option, int64_t batch_size, uint64_t bytes_per_sample,
                        int ranks_on_node, const HostMemory& memory);

}  // namespace ddp

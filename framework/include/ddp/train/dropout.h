#pragma once
// Dropout that draws from the replica's own generator (util/generator.h), so that replicas
// sharing a process draw what the ranks they stand for would draw. torch::nn::Dropout draws from
// the process's default generator, which the replica threads of one process would share.

#include <torch/types.h>

namespace ddp {

// LibTorch's arithmetic (a keep mask drawn by bernoulli_(1 - p), scaled by 1 / (1 - p)), drawing
// on the CPU from ddp::cpu_generator(); on a GPU torch::dropout itself (each replica's device has
// a generator of its own). Bit-identical to torch::dropout for the same generator state.
// Identity when !training or p == 0. Throws std::invalid_argument unless 0 <= p <= 1.
torch::Tensor dropout(const torch::Tensor& input, double p, bool training);

}  // namespace ddp

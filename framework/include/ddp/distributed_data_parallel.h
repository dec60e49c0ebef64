#pragma once
// Data-parallel training of any torch::nn::Module: every rank holds a full replica, computes
// gradients on its own shard of the batch, and after loss.backward() returns every parameter's
// grad() holds the average over all ranks. No extra call is needed in the training loop.
//
// Construction (collective): verifies that every rank has the same parameters and buffers
// (names, shapes, dtypes; the first mismatch is reported on every rank), then broadcasts
// parameters and buffers from rank 0 so all replicas start identical.
//
// Gradient sync: a hook on each parameter averages its incoming gradient over the ranks before
// autograd accumulates it into grad(). Accumulating averages equals averaging accumulations, so
// gradient accumulation over several backward passes stays correct.
// Invariant: every rank runs backward over the same set of parameters in the same order (same
// model, same graph), because each hook is a collective.

#include <ddp/communicator.h>
#include <ddp/runtime.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace ddp {

class DistributedDataParallel {
 public:
  DistributedDataParallel(Runtime& runtime, std::shared_ptr<torch::nn::Module> module);
  // Removes the gradient hooks: the module trains locally again afterwards.
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() const { return *module_; }
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }

  // Cumulative wall time and payload of the gradient all-reduces since construction.
  double sync_seconds() const { return sync_seconds_; }
  int64_t sync_bytes() const { return sync_bytes_; }

 private:
  torch::Tensor average(const torch::Tensor& grad);

  std::shared_ptr<torch::nn::Module> module_;
  Communicator& comm_;
  std::vector<torch::Tensor> params_;      // in registration order
  std::vector<std::pair<size_t, unsigned>> hooks_;  // (index into params_, hook handle)
  double sync_seconds_ = 0;
  int64_t sync_bytes_ = 0;
};

}  // namespace ddp

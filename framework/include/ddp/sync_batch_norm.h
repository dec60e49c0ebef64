#pragma once
// ddp::BatchNorm2d: torch::nn::BatchNorm2d's numerics and state (weight, bias, running_mean,
// running_var, num_batches_tracked, same names, so checkpoints load either way) with one extra
// mode: synchronised. Synchronised, training-mode forward computes each channel's mean and
// variance over the batches of all ranks (one all-reduce of per-channel sums and counts), and
// backward all-reduces the two per-channel gradient terms, so N ranks with per-rank batch b
// compute what one process computes on the N*b batch (PyTorch's SyncBatchNorm). Eval mode
// uses the running statistics and never communicates.
//
// Why a module of our own rather than swapping torch::nn::BatchNorm2d in place, as Python's
// convert_sync_batchnorm does: a LibTorch model holds its layers in typed C++ members, so a
// replaced child would not be the one forward() calls. Models built with ddp::BatchNorm2d are
// converted in place by convert_sync_batchnorm.

#include <ddp/communicator.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <ostream>

namespace ddp {

class BatchNorm2dImpl : public torch::nn::Cloneable<BatchNorm2dImpl> {
 public:
  explicit BatchNorm2dImpl(int64_t num_features)
      : BatchNorm2dImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit BatchNorm2dImpl(const torch::nn::BatchNormOptions& options);

  void reset() override;
  // `input` is [batch, num_features, height, width]. Local mode, and eval mode in either mode,
  // is exactly torch::nn::BatchNorm2d (without running statistics, eval mode normalises with
  // this rank's batch, as PyTorch's SyncBatchNorm does). Synchronised training mode runs the
  // synchronised path even on one rank; ranks may hold different batch sizes, empty ones
  // included, but all ranks together must hold more than one value per channel.
  torch::Tensor forward(const torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  // Null: local statistics (plain BatchNorm). Set: synchronised over `comm`'s ranks, which
  // must all run the same forwards and backwards in the same order.
  void set_sync_communicator(std::shared_ptr<Communicator> comm) { sync_comm_ = std::move(comm); }
  bool synchronised() const { return sync_comm_ != nullptr; }

  torch::nn::BatchNormOptions options;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  // Counts this training batch and returns the weight of its statistics in the running ones
  // (torch::nn::BatchNorm2d's rule, cumulative average when momentum is null).
  double running_average_factor();
  torch::Tensor forward_synchronised(const torch::Tensor& input);

  std::shared_ptr<Communicator> sync_comm_;
};
TORCH_MODULE(BatchNorm2d);

// Makes every ddp::BatchNorm2d in `module` (recursively, `module` included) synchronised over
// `comm` (collective use only: every rank converts the same model). Throws
// std::invalid_argument naming any torch::nn::BatchNorm{1,2,3}d it finds, which cannot be
// converted (see above), before converting anything. Returns the number of layers converted.
int convert_sync_batchnorm(torch::nn::Module& module, std::shared_ptr<Communicator> comm);

}  // namespace ddp

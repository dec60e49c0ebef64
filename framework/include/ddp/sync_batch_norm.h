#pragma once
/// \file
/// Batch normalisation that can be synchronised across ranks (PyTorch's SyncBatchNorm):
/// ddp::BatchNorm1d, ddp::BatchNorm2d and ddp::BatchNorm3d, and convert_sync_batchnorm.
///
/// Each has torch::nn::BatchNormXd's numerics and state (the same names, so checkpoints load
/// either way). Synchronised, a training-mode forward computes each channel's mean and variance
/// over the batches of all ranks and backward all-reduces the per-channel gradient terms, so N
/// ranks with batch b compute what one process computes on N*b (output, input gradient, running
/// statistics; weight and bias gradients are each rank's share, which DDP's averaging combines).
/// Eval mode never communicates.
///
/// The change in a user's model is one type per layer, then one call:
/// \code
///   torch::nn::BatchNorm1d norm{nullptr};   // before
///   ddp::BatchNorm1d norm{nullptr};         // after (same options, parameters, buffers)
///   ...
///   ddp::convert_sync_batchnorm(*model, group.for_device(device));  // synchronise every one
/// \endcode
/// (or `layer->set_sync_communicator(comm)` for one layer). Unsynchronised, the ddp layers
/// compute exactly what torch::nn's do, so a model can use them unconditionally.
///
/// Why modules of our own rather than swapping torch::nn::BatchNormXd in place, as Python's
/// convert_sync_batchnorm does: a LibTorch model holds its layers in typed C++ members, so a
/// replaced child would not be the one forward() calls.

#include <ddp/communicator.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <utility>

namespace ddp {

/// Batch normalisation of inputs with D spatial dimensions, optionally synchronised over the
/// ranks of a Communicator. Use it through ddp::BatchNorm1d, ddp::BatchNorm2d, ddp::BatchNorm3d.
///
/// Accepted input: D = 1: [batch, channels] or [batch, channels, length]; D = 2: [batch,
/// channels, height, width]; D = 3: [batch, channels, depth, height, width]; channels must be
/// options.num_features(). Anything else throws std::invalid_argument naming the module and
/// the input's shape.
template <int64_t D>
class BatchNormImpl : public torch::nn::Cloneable<BatchNormImpl<D>> {
  static_assert(D >= 1 && D <= 3, "ddp::BatchNormImpl<D>: D is 1, 2 or 3");

 public:
  /// torch::nn::BatchNormOptions(num_features): eps 1e-5, momentum 0.1, affine, running stats.
  explicit BatchNormImpl(int64_t num_features)
      : BatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}
  /// The options of torch::nn::BatchNormXd, with the same meaning.
  explicit BatchNormImpl(const torch::nn::BatchNormOptions& options);

  /// Registers the parameters and buffers as torch::nn::BatchNormXd does (same names, order,
  /// initial values): weight 1, bias 0, running_mean 0, running_var 1, num_batches_tracked 0.
  void reset() override;

  /// Not synchronised, or in eval mode: exactly torch::nn::BatchNormXd (without running
  /// statistics, eval mode normalises with this rank's batch, as PyTorch's SyncBatchNorm does).
  /// Synchronised training mode runs the synchronised path even on one rank; ranks may hold
  /// different batch sizes, empty ones included, but together more than one value per channel.
  /// A channel count other than num_features is an error even where torch::nn would go on.
  torch::Tensor forward(const torch::Tensor& input);

  /// `ddp::BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true,
  /// synchronised=false)`.
  void pretty_print(std::ostream& stream) const override;

  /// Null: local statistics (plain batch norm). Set: synchronised over `comm`'s ranks, which
  /// must all run the same forwards and backwards in the same order. The communicator must
  /// reach the input's device (ProcessGroup::for_device).
  void set_sync_communicator(std::shared_ptr<Communicator> comm) { sync_comm_ = std::move(comm); }
  /// Whether a communicator is set.
  bool synchronised() const { return sync_comm_ != nullptr; }

  /// The options given at construction.
  torch::nn::BatchNormOptions options;
  // Named as in torch::nn::BatchNormXd, so checkpoints load both ways.
  /// The scale parameter, [num_features]; undefined without options.affine().
  torch::Tensor weight;
  /// The shift parameter, [num_features]; undefined without options.affine().
  torch::Tensor bias;
  /// The running mean buffer, [num_features]; undefined without options.track_running_stats().
  torch::Tensor running_mean;
  /// The running (unbiased) variance buffer, [num_features]; undefined without
  /// options.track_running_stats().
  torch::Tensor running_var;
  /// The count of training batches seen (int64 scalar); undefined without
  /// options.track_running_stats().
  torch::Tensor num_batches_tracked;

 private:
  // Throws unless `input` has this module's rank and channel count.
  void check_input(const torch::Tensor& input) const;
  // Counts this training batch and returns the weight of its statistics in the running ones
  // (torch::nn::BatchNormXd's rule, cumulative average when momentum is null).
  double running_average_factor();
  torch::Tensor forward_synchronised(const torch::Tensor& input);

  std::shared_ptr<Communicator> sync_comm_;
};

// Defined once, in the library, for the three dimensions.
extern template class BatchNormImpl<1>;
extern template class BatchNormImpl<2>;
extern template class BatchNormImpl<3>;

/// Batch norm over [batch, channels] or [batch, channels, length] (torch::nn::BatchNorm1d's).
using BatchNorm1dImpl = BatchNormImpl<1>;
/// Batch norm over [batch, channels, height, width] (torch::nn::BatchNorm2d's).
using BatchNorm2dImpl = BatchNormImpl<2>;
/// Batch norm over [batch, channels, depth, height, width] (torch::nn::BatchNorm3d's).
using BatchNorm3dImpl = BatchNormImpl<3>;
/// The module holder of BatchNorm1dImpl, like torch::nn::BatchNorm1d.
TORCH_MODULE(BatchNorm1d);
/// The module holder of BatchNorm2dImpl, like torch::nn::BatchNorm2d.
TORCH_MODULE(BatchNorm2d);
/// The module holder of BatchNorm3dImpl, like torch::nn::BatchNorm3d.
TORCH_MODULE(BatchNorm3d);

/// Makes every ddp::BatchNorm1d, 2d and 3d in `module` (recursively, `module` included)
/// synchronised over `comm` (collective use only: every rank converts the same model). Throws
/// std::invalid_argument naming any torch::nn::BatchNorm1d, 2d or 3d it finds, which cannot be
/// converted (see the top of this file), before converting anything, and when `comm` is null.
/// Returns the number of layers converted (a layer registered twice counts once).
int convert_sync_batchnorm(torch::nn::Module& module, std::shared_ptr<Communicator> comm);

}  // namespace ddp

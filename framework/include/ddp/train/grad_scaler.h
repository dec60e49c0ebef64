#pragma once
/// \file
/// Loss scaling for fp16 mixed precision, as torch.amp.GradScaler, with the overflow decision
/// agreed over the ranks.
///
///   ddp::GradScaler scaler(&group.cpu());
///   {
///     ddp::Autocast autocast(torch::kCUDA, torch::kHalf);   // autocast.h
///     loss = loss_fn(model(inputs), targets);
///   }
///   scaler.scale(loss).backward();      // gradients averaged, still scaled
///   scaler.unscale_(optimizer);         // optional: before ddp::clip_grad_norm
///   scaler.step(optimizer);             // skipped when a gradient is inf or NaN
///   scaler.update();                    // backoff after a skip, growth after growth_interval
///
/// PyTorch's ATen kernels unscale, check and update the scale, so the scales and skipped steps are
/// torch's on the same gradients.
///
/// Why an agreement: unscale_() all-reduces the found-inf flag (max) over `comm`, so every rank
/// skips the same steps and keeps the same scale. The averaged gradients usually carry an inf to
/// every rank, but not always (an average that overflows only once multiplied by 1/scale, a
/// gradient written outside the reducer, compression rounding differently), and one rank skipping
/// a step its peers took would silently leave the replicas apart.
///
/// Gradients must be fp32 (fp16 gradients are refused, as PyTorch does). One scaler may serve
/// several optimizers: each gets unscale_/step once per iteration, then one update().

#include <ddp/communicator.h>

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <map>

namespace ddp {

/// torch.amp.GradScaler's arguments and defaults; GradScaler's constructor checks each.
struct GradScalerOptions {
  double init_scale = 65536.0;     ///< 2^16, PyTorch's default; finite and > 0
  double growth_factor = 2.0;      ///< the scale's factor after growth_interval good steps; > 1
  double backoff_factor = 0.5;     ///< the scale's factor after a skipped step; in (0, 1)
  int64_t growth_interval = 2000;  ///< steps in a row without inf or NaN before growing; >= 1
  /// false: scale() returns the loss, step() is optimizer.step(), update() does nothing.
  bool enabled = true;
};

/// The fp16 loss scaler of the file's text: scale(), unscale_(), step(), update() per iteration.
class GradScaler {
 public:
  /// `comm`: where the found-inf flag is agreed (ProcessGroup::cpu()); null for one process.
  /// std::invalid_argument for options out of range (GradScalerOptions::growth_factor, ...).
  explicit GradScaler(Communicator* comm, GradScalerOptions options = {});

  /// loss * scale. The scale lives on the device of the first loss scaled.
  torch::Tensor scale(const torch::Tensor& loss);
  /// Divides the optimizer's gradients by the scale and records whether any is inf or NaN on any
  /// rank (collective when comm has more than one rank). At most once per optimizer between
  /// update()s (std::logic_error otherwise).
  void unscale_(torch::optim::Optimizer& optimizer);
  /// unscale_() unless done, then optimizer.step() unless a gradient was inf or NaN. Returns
  /// whether the optimizer stepped (the same on every rank).
  bool step(torch::optim::Optimizer& optimizer);
  /// Backs the scale off after a skipped step, grows it after growth_interval steps in a row
  /// without; then a new iteration begins. std::logic_error if no optimizer was unscaled since
  /// the last update().
  void update();

  double get_scale() const;        ///< the current scale (init_scale before the first scale())
  int64_t growth_tracker() const;  ///< successful steps since the last change of scale

  ///@{
  /// The scale and the growth tracker (PyTorch's state_dict); load() keeps this scaler's options
  /// and throws std::runtime_error when the archive's are not scalars.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  ///@}

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    torch::Tensor found_inf;  ///< float32 scalar on the scale's device, agreed over ranks
  };
  void lazy_init(const torch::Device& device);

  Communicator* comm_;
  GradScalerOptions options_;
  torch::Tensor scale_;           ///< float32 scalar
  torch::Tensor growth_tracker_;  ///< int32 scalar
  std::map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace ddp

#pragma once
/// \file
/// Adadelta for LibTorch, which ships none: torch.optim.Adadelta's single-tensor algorithm,
/// weight decay included.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <vector>

namespace ddp {

/// Adadelta's hyperparameters, torch.optim.Adadelta's names and defaults; the constructor throws
/// std::invalid_argument unless each is finite, rho in [0, 1] and the others >= 0.
struct AdadeltaOptions : public torch::optim::OptimizerCloneableOptions<AdadeltaOptions> {
  /// Options with learning rate `lr`, the others at their defaults.
  AdadeltaOptions(double lr = 1.0) : lr_(lr) {}
  /// The factor on each update (the LR schedulers change it through set_lr).
  TORCH_ARG(double, lr) = 1.0;
  /// The decay of both running averages (of grad^2 and of update^2).
  TORCH_ARG(double, rho) = 0.9;
  /// Added under both square roots, for numerical stability.
  TORCH_ARG(double, eps) = 1e-6;
  /// L2 penalty: weight_decay x parameter is added to the gradient before the update; 0: none.
  TORCH_ARG(double, weight_decay) = 0;

 public:
  double get_lr() const override { return lr(); }          ///< lr(), for the LR schedulers
  void set_lr(const double lr) override { this->lr(lr); }  ///< lr(lr), for the LR schedulers
  ///@{
  /// Reads or writes lr, rho, eps and weight_decay by name.
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  ///@}
};

/// A parameter's running averages, kept in the base class's state() as torch::optim's
/// optimizers keep theirs, so that code that moves state between optimizers by parameter
/// (ZeroRedundancyOptimizer's consolidation) sees it.
struct AdadeltaParamState : public torch::optim::OptimizerCloneableParamState<AdadeltaParamState> {
  TORCH_ARG(torch::Tensor, square_avg);  ///< running average of grad^2
  TORCH_ARG(torch::Tensor, acc_delta);   ///< running average of update^2

 public:
  ///@{
  /// Reads or writes square_avg and acc_delta.
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  ///@}
};

/// torch.optim.Adadelta's update, bit for bit: per parameter with a gradient, the running
/// averages start at zero on its first step; a parameter without a gradient is left alone.
class Adadelta : public torch::optim::Optimizer {
 public:
  /// One parameter group of `params`. Throws std::invalid_argument naming the option when one
  /// of `defaults` is out of range (see AdadeltaOptions).
  explicit Adadelta(std::vector<torch::Tensor> params, AdadeltaOptions defaults = {});

  /// Updates every parameter that has a gradient, without autograd; returns the loss of
  /// `closure` (run with autograd on) when given, else an undefined tensor.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Saves and restores the running averages with the options, by parameter position.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Throws std::runtime_error when the archive holds another number of parameters.
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace ddp

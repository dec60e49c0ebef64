#pragma once
/// \file
/// Adadelta for LibTorch, which ships none: numerically the algorithm of torch.optim.Adadelta
/// (PyTorch 1.13, single-tensor path), including weight decay. Works with LibTorch's LR
/// schedulers (StepLR) through get_lr/set_lr.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <vector>

namespace ddp {

struct AdadeltaOptions : public torch::optim::OptimizerCloneableOptions<AdadeltaOptions> {
  AdadeltaOptions(double lr = 1.0) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1.0;
  TORCH_ARG(double, rho) = 0.9;
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// A parameter's running averages, kept in the base class's state() as torch::optim's
/// optimizers keep theirs, so that code that moves state between optimizers by parameter
/// (ZeroRedundancyOptimizer's consolidation) sees it.
struct AdadeltaParamState : public torch::optim::OptimizerCloneableParamState<AdadeltaParamState> {
  TORCH_ARG(torch::Tensor, square_avg);  ///< running average of grad^2
  TORCH_ARG(torch::Tensor, acc_delta);   ///< running average of update^2

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class Adadelta : public torch::optim::Optimizer {
 public:
  explicit Adadelta(std::vector<torch::Tensor> params, AdadeltaOptions defaults = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Saves and restores the running averages with the options, by parameter position.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace ddp

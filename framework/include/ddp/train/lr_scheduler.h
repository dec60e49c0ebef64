#pragma once
/// \file
/// Learning-rate schedules stepped once per epoch, matching torch.optim.lr_scheduler. Both take
/// Python's initial step in their constructor (LibTorch's StepLR does not, and decays one epoch
/// late). Their rates depend only on the step count, so replaying the steps restores them
/// (snapshot.h relies on that).

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/step_lr.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

/// torch.optim.lr_scheduler.StepLR: the rate times `gamma` every `step_size` epochs (step() once
/// per epoch), with Python's initial step (the file's text).
class StepLR : public torch::optim::StepLR {
 private:
  /// LibTorch checks neither: step_size 0 divides by zero, a NaN gamma makes every rate NaN.
  static unsigned checked_step_size(unsigned step_size) {
    if (step_size == 0) throw std::invalid_argument("StepLR: step_size must be >= 1 (got 0)");
    return step_size;
  }
  static double checked_gamma(double gamma) {
    if (!std::isfinite(gamma) || gamma < 0) {
      throw std::invalid_argument("StepLR: gamma must be finite and >= 0 (got " +
                                  std::to_string(gamma) + ")");
    }
    return gamma;
  }

 public:
  /// Throws std::invalid_argument for step_size 0 or a gamma not finite and >= 0.
  StepLR(torch::optim::Optimizer& optimizer, unsigned step_size, double gamma = 0.1)
      : torch::optim::StepLR(optimizer, checked_step_size(step_size), checked_gamma(gamma)) {
    step();  // Python's initial step: leaves the learning rate as it is
  }
};

/// torch.optim.lr_scheduler.CosineAnnealingLR's closed form, rising again past t_max as Python's
/// does; step() once per epoch.
class CosineAnnealingLR : public torch::optim::LRScheduler {
 public:
  /// `t_max`: epochs from the base learning rate (the optimizer's now) down to eta_min.
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t t_max, double eta_min = 0.0)
      : torch::optim::LRScheduler(optimizer),
        base_lrs_(get_current_lrs()),
        t_max_(t_max),
        eta_min_(eta_min) {
    if (t_max < 0) {
      throw std::invalid_argument("CosineAnnealingLR: t_max must be >= 0 (got " +
                                  std::to_string(t_max) + ")");
    }
    if (!std::isfinite(eta_min)) {
      throw std::invalid_argument("CosineAnnealingLR: eta_min must be finite (got " +
                                  std::to_string(eta_min) + ")");
    }
    step();  // Python's initial step, as in StepLR above
  }

 private:
  std::vector<double> get_lrs() override {
    // step_count_ counts the initial step, so it is the epoch about to start.
    const double pi = std::acos(-1.0);
    const double progress = t_max_ > 0 ? static_cast<double>(step_count_) / t_max_ : 1.0;
    std::vector<double> lrs;
    for (double base : base_lrs_) {
      lrs.push_back(eta_min_ + (base - eta_min_) * (1.0 + std::cos(pi * progress)) / 2.0);
    }
    return lrs;
  }

  std::vector<double> base_lrs_;
  int64_t t_max_;
  double eta_min_;
};

}  // namespace ddp

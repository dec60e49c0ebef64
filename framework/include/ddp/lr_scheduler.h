#pragma once
// LibTorch's StepLR counts epochs one behind torch.optim.lr_scheduler.StepLR: Python's
// constructor takes an initial step, LibTorch's does not, so LibTorch decays the learning rate
// one epoch late (the same in 1.13 and 2.x). This StepLR takes that initial step, so C++ and
// Python runs use the same learning rate in every epoch.

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/step_lr.h>

namespace ddp {

class StepLR : public torch::optim::StepLR {
 public:
  StepLR(torch::optim::Optimizer& optimizer, unsigned step_size, double gamma = 0.1)
      : torch::optim::StepLR(optimizer, step_size, gamma) {
    step();  // Python's initial step: leaves the learning rate as it is
  }
};

}  // namespace ddp

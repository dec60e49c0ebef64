#include <ddp/train/lr_scheduler.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <sstream>

namespace {

// The learning rate of every epoch 0..epochs-1, stepping the scheduler after each as
// Trainer::fit does.
template <typename Scheduler, typename... Args>
std::vector<double> lrs_per_epoch(int epochs, Args... args) {
  torch::Tensor w = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD optimizer({w}, torch::optim::SGDOptions(0.1));
  Scheduler scheduler(optimizer, args...);
  std::vector<double> lrs;
  for (int e = 0; e < epochs; ++e) {
    lrs.push_back(optimizer.param_groups()[0].options().get_lr());
    scheduler.step();
  }
  return lrs;
}

std::vector<double> python_lrs(const std::string& scheduler, int epochs) {
  const std::string script =
      "import torch\n"
      "w = torch.zeros(1, requires_grad=True)\n"
      "opt = torch.optim.SGD([w], lr=0.1)\n"
      "s = torch.optim.lr_scheduler." +
      scheduler +
      "\n"
      "for e in range(" +
      std::to_string(epochs) +
      "):\n"
      "    print(repr(opt.param_groups[0][\"lr\"]))\n"
      "    opt.step()\n"
      "    s.step()\n";
  std::istringstream out(ddp_test::run_command(std::string(DDP_PYTHON) + " -c '" + script + "'"));
  std::vector<double> lrs;
  for (double lr; out >> lr;) lrs.push_back(lr);
  return lrs;
}

TEST(LRScheduler, CosineAnnealingMatchesPyTorchIncludingPastTMax) {
  const auto ours = lrs_per_epoch<ddp::CosineAnnealingLR>(9, int64_t{5}, 0.001);
  const auto python = python_lrs("CosineAnnealingLR(opt, T_max=5, eta_min=0.001)", 9);
  ASSERT_EQ(python.size(), ours.size());
  for (size_t e = 0; e < ours.size(); ++e) {
    // Python updates recursively, we use the closed form: equal to rounding.
    EXPECT_NEAR(ours[e], python[e], 1e-12) << "epoch " << e;
  }
  EXPECT_DOUBLE_EQ(ours[0], 0.1);
  EXPECT_NEAR(ours[5], 0.001, 1e-15);
}

TEST(LRScheduler, StepLRMatchesPyTorch) {
  const auto ours = lrs_per_epoch<ddp::StepLR>(7, 2u, 0.5);
  const auto python = python_lrs("StepLR(opt, step_size=2, gamma=0.5)", 7);
  ASSERT_EQ(python.size(), ours.size());
  for (size_t e = 0; e < ours.size(); ++e) EXPECT_DOUBLE_EQ(ours[e], python[e]) << "epoch " << e;
}

}  // namespace

#include <ddp/train/adadelta.h>
#include <ddp/train/lr_scheduler.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <sstream>

namespace {

struct Problem {
  torch::Tensor x, y, w, b;
};

// The closed-form problem of tests/reference/adadelta.py.
Problem make_problem() {
  auto f64 = torch::kDouble;
  Problem p;
  p.x = torch::sin(torch::arange(32, f64).reshape({8, 4}) * 0.37).to(torch::kFloat);
  p.y = torch::cos(torch::arange(24, f64).reshape({8, 3}) * 0.11).to(torch::kFloat);
  p.w = (torch::sin(torch::arange(12, f64).reshape({3, 4}) * 1.3) * 0.5)
            .to(torch::kFloat)
            .requires_grad_();
  p.b = (torch::cos(torch::arange(3, f64)) * 0.1).to(torch::kFloat).requires_grad_();
  return p;
}

void train_steps(Problem& p, torch::optim::Optimizer& opt, int steps) {
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::Tensor loss = (torch::matmul(p.x, p.w.t()) + p.b - p.y).pow(2).mean();
    loss.backward();
    opt.step();
  }
}

TEST(Adadelta, MatchesPyTorchWithStepLR) {
  const std::string reference = ddp_test::run_command(std::string(DDP_PYTHON) + " " + DDP_TEST_DIR +
                                                      "/reference/adadelta.py");
  std::istringstream lines(reference);
  int configs = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    double lr, rho, eps, wd, gamma;
    std::string colon;
    in >> lr >> rho >> eps >> wd >> gamma >> colon;
    ASSERT_EQ(colon, ":");
    std::vector<double> expected;
    for (double v; in >> v;) expected.push_back(v);
    ASSERT_EQ(expected.size(), 15u);

    Problem p = make_problem();
    ddp::Adadelta opt({p.w, p.b}, ddp::AdadeltaOptions(lr).rho(rho).eps(eps).weight_decay(wd));
    ddp::StepLR scheduler(opt, 1, gamma);
    for (int epoch = 0; epoch < 3; ++epoch) {
      train_steps(p, opt, 5);
      scheduler.step();
    }
    const torch::Tensor actual =
        torch::cat({p.w.detach().flatten(), p.b.detach()}).to(torch::kDouble);
    const torch::Tensor want = torch::tensor(expected, torch::kDouble);
    const double max_diff = (actual - want).abs().max().item<double>();
    EXPECT_LE(max_diff, 1e-7) << "config " << line.substr(0, line.find(':'))
                              << ": max |C++ - PyTorch| = " << max_diff;
    ++configs;
  }
  EXPECT_EQ(configs, 2);
}

TEST(StepLR, DecaysAtEveryEpochEndLikePython) {
  Problem p = make_problem();
  ddp::Adadelta opt({p.w, p.b}, ddp::AdadeltaOptions(1.0));
  ddp::StepLR scheduler(opt, 1, 0.5);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 1.0);
  scheduler.step();  // end of epoch 1
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.5);
  scheduler.step();
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.25);
}

TEST(Adadelta, SaveAndLoadContinueIdentically) {
  Problem a = make_problem();
  ddp::Adadelta opt_a({a.w, a.b}, ddp::AdadeltaOptions(0.7).weight_decay(0.01));
  train_steps(a, opt_a, 3);

  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    opt_a.save(archive);
    archive.save_to(saved);
  }
  Problem b = make_problem();
  {
    torch::NoGradGuard no_grad;
    b.w.copy_(a.w);
    b.b.copy_(a.b);
  }
  ddp::Adadelta opt_b({b.w, b.b}, ddp::AdadeltaOptions(99.0));  // options come from the file
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  opt_b.load(archive);
  EXPECT_DOUBLE_EQ(opt_b.param_groups()[0].options().get_lr(), 0.7);

  train_steps(a, opt_a, 3);
  train_steps(b, opt_b, 3);
  EXPECT_TRUE(torch::equal(a.w, b.w));
  EXPECT_TRUE(torch::equal(a.b, b.b));
}

TEST(Adadelta, LoadRejectsADifferentParameterCount) {
  Problem a = make_problem();
  ddp::Adadelta opt_a({a.w, a.b});
  train_steps(a, opt_a, 1);
  std::stringstream saved;
  torch::serialize::OutputArchive out;
  opt_a.save(out);
  out.save_to(saved);

  ddp::Adadelta opt_b({a.w});
  torch::serialize::InputArchive in;
  in.load_from(saved);
  EXPECT_THROW(opt_b.load(in), std::runtime_error);
}

}  // namespace

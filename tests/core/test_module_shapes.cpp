// Modules shaped unlike a one-forward MyNet: torch::nn::Sequential through the wrapper, and what
// a wrapper that cannot call the module's forward says.
#include <ddp/distributed_data_parallel.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

namespace test_module_shapes {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

torch::nn::Sequential make_sequential() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(10, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 3));
}

torch::Tensor flat_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten().to(torch::kDouble));
  return torch::cat(parts);
}

// model.forward(x) on a Sequential runs it, and training through it equals one process on the
// global batch (up to the order of float sums).
TEST(ModuleShapes, SequentialTrainsThroughTheWrappersForward) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t b = 4, steps = 4;
  torch::nn::Sequential net = make_sequential(), reference = make_sequential();
  ddp::DistributedDataParallel model(pg(), net);
  ASSERT_TRUE(model.has_forward());
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({steps, w * b, 10});
  const torch::Tensor y = torch::randint(0, 3, {steps, w * b}, torch::kLong);
  for (int64_t s = 0; s < steps; ++s) {
    const torch::Tensor mine = x[s].slice(0, r * b, (r + 1) * b);
    {
      torch::NoGradGuard no_grad;  // evaluation: not collective, the module's own output
      EXPECT_TRUE(torch::equal(model.forward(mine), net->forward(mine)));
    }
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model.forward(mine), y[s].slice(0, r * b, (r + 1) * b))
        .backward();
    opt.step();
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x[s]), y[s]).backward();
    ref_opt.step();
    const torch::Tensor got = flat_parameters(*net), want = flat_parameters(*reference);
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-6))
        << "step " << s << ": max diff " << (got - want).abs().max().item<double>();
    EXPECT_TRUE(ddp_test::identical_on_all_ranks(got)) << "replicas diverged at step " << s;
  }
}

struct TwoForwards : torch::nn::Module {
  TwoForwards() : fc(register_module("fc", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::Tensor forward(const torch::Tensor& x, double scale) { return fc(x) * scale; }
  torch::nn::Linear fc;
};

// An overloaded forward leaves the wrapper with the plain pointer: forward() names the module's
// type and the fix, and prepare_forward() plus the module's own call still train.
TEST(ModuleShapes, AnUncallableForwardIsNamedWithTheModulesType) {
  auto net = std::make_shared<TwoForwards>();
  ddp::DistributedDataParallel model(pg(), net);  // compiles: the plain-pointer constructor
  EXPECT_FALSE(model.has_forward());
  try {
    model.forward(torch::ones({1, 4}));
    FAIL() << "forward() ran a module it cannot call";
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("TwoForwards"), std::string::npos) << what;
    EXPECT_NE(what.find("prepare_forward()"), std::string::npos) << what;
  }
  model.prepare_forward();
  net->forward(torch::full({2, 4}, static_cast<double>(rt().rank() + 1)), 2.0).sum().backward();
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(net->fc->weight.grad()));
}

}  // namespace test_module_shapes

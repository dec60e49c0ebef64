#include <ddp/distributed_data_parallel.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

namespace {

ddp::Runtime& rt() { return ddp_test::runtime(); }

struct Mlp : torch::nn::Module {
  explicit Mlp(int64_t hidden = 16)
      : fc1(register_module("fc1", torch::nn::Linear(10, hidden))),
        norm(register_module("norm", torch::nn::BatchNorm1d(hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear fc2;
};

// All parameters and buffers, flattened into one double vector.
torch::Tensor flat_state(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten().to(torch::kDouble));
  for (const auto& b : m.buffers()) parts.push_back(b.detach().flatten().to(torch::kDouble));
  return torch::cat(parts);
}

// True on every rank iff every rank's tensor is bit-identical to rank 0's.
bool identical_on_all_ranks(const torch::Tensor& t) {
  const torch::Tensor all = rt().cpu_communicator().all_gather(t.contiguous());
  for (int r = 1; r < rt().world_size(); ++r) {
    if (!torch::equal(all[r], all[0])) return false;
  }
  return true;
}

TEST(DistributedDataParallel, ConstructionBroadcastsParametersAndBuffers) {
  torch::manual_seed(100 + rt().rank());  // a different initialisation on every rank
  auto net = std::make_shared<Mlp>();
  {
    torch::NoGradGuard no_grad;
    net->norm->running_mean.fill_(static_cast<float>(rt().rank()));
  }
  ddp::DistributedDataParallel model(rt(), net);
  EXPECT_TRUE(identical_on_all_ranks(flat_state(*net)));
  EXPECT_EQ(net->norm->running_mean[0].item<float>(), 0.0f);  // rank 0's buffer
}

TEST(DistributedDataParallel, ShapeMismatchFailsOnEveryRankNamingIt) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = std::make_shared<Mlp>(rt().rank() == 1 ? 17 : 16);
  try {
    ddp::DistributedDataParallel model(rt(), net);
    FAIL() << "no exception on rank " << rt().rank();
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parameter 'fc1.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0: parameter 'fc1.weight' Float [16, 10]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1: parameter 'fc1.weight' Float [17, 10]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ranks differing from rank 0: 1)"), std::string::npos) << msg;
  }
}

TEST(DistributedDataParallel, DtypeMismatchIsCaughtToo) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = std::make_shared<Mlp>();
  if (rt().rank() == rt().world_size() - 1) net->fc2->to(torch::kDouble);
  EXPECT_THROW(ddp::DistributedDataParallel(rt(), net), std::runtime_error);
}

// N ranks with batch b train exactly like one process with batch N*b: after every step each
// rank's parameters equal the single-process reference (float tolerance) and are bit-identical
// across ranks. No dropout; BatchNorm is left out because its batch statistics are per rank.
TEST(DistributedDataParallel, EquivalentToOneProcessOnTheGlobalBatch) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t b = 4, steps = 6;
  auto make = [] {
    torch::manual_seed(3);
    return torch::nn::Sequential(torch::nn::Linear(10, 32), torch::nn::Tanh(),
                                 torch::nn::Linear(32, 32), torch::nn::ReLU(),
                                 torch::nn::Linear(32, 3));
  };
  torch::nn::Sequential distributed = make(), reference = make();
  ddp::DistributedDataParallel model(rt(), distributed.ptr());
  torch::optim::SGD opt(distributed->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({steps, w * b, 10});
  const torch::Tensor y = torch::randint(0, 3, {steps, w * b}, torch::kLong);
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::Tensor mine = x[s].slice(0, r * b, (r + 1) * b);
    torch::nn::functional::cross_entropy(distributed->forward(mine), y[s].slice(0, r * b, (r + 1) * b)).backward();
    opt.step();

    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x[s]), y[s]).backward();
    ref_opt.step();

    const torch::Tensor got = flat_state(*distributed), want = flat_state(*reference);
    EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6))
        << "step " << s << " max diff " << (got - want).abs().max().item<double>();
    EXPECT_TRUE(identical_on_all_ranks(got)) << "replicas diverged at step " << s;
  }
  if (w > 1) {
    int64_t param_bytes = 0;
    for (const auto& p : distributed->parameters()) param_bytes += p.numel() * 4;
    EXPECT_EQ(model.sync_bytes(), steps * param_bytes);
    EXPECT_GT(model.sync_seconds(), 0.0);
  }
}

// Two backward passes before one step accumulate the averaged gradients.
TEST(DistributedDataParallel, GradientAccumulationAveragesEachPass) {
  const int w = rt().world_size(), r = rt().rank();
  torch::manual_seed(5);
  torch::nn::Linear net(4, 2);
  torch::nn::Linear ref(4, 2);
  {
    torch::NoGradGuard no_grad;
    ref->weight.copy_(net->weight);
    ref->bias.copy_(net->bias);
  }
  ddp::DistributedDataParallel model(rt(), net.ptr());
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({2, w, 4});
  for (int k = 0; k < 2; ++k) {
    net->forward(x[k][r].unsqueeze(0)).pow(2).sum().backward();
    // The reference: the mean over ranks of each rank's loss.
    (ref->forward(x[k]).pow(2).sum(1).mean()).backward();
  }
  EXPECT_TRUE(torch::allclose(net->weight.grad(), ref->weight.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(net->bias.grad(), ref->bias.grad(), 1e-5, 1e-6));
}

TEST(DistributedDataParallel, DestructionRemovesTheHooks) {
  torch::nn::Linear net(3, 1);
  { ddp::DistributedDataParallel model(rt(), net.ptr()); }
  // Only this rank runs backward: with hooks left behind it would wait for the others forever.
  if (rt().is_main()) {
    net->forward(torch::ones({1, 3})).sum().backward();
    EXPECT_TRUE(torch::allclose(net->weight.grad(), torch::ones({1, 3})));
  }
}

}  // namespace

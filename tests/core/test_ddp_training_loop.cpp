// Issue 13's training loop at 1, 2 and 4 ranks: the forward through the DDP wrapper does the
// pre-forward work; calling the module directly still averages; gradient accumulation with
// no_sync() and clipping equal one process on the global batch; GradScaler's overflow decision
// is the same on every rank.
#include <ddp/train/grad_clip.h>
#include <ddp/train/grad_scaler.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/replica_check.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

namespace test_ddp_training_loop {

using ddp_test::identical_on_all_ranks;

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

struct Net : torch::nn::Module {
  Net()
      : fc1(register_module("fc1", torch::nn::Linear(10, 16))),
        norm(register_module("norm", torch::nn::BatchNorm1d(16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear fc2;
};

// No BatchNorm: its batch statistics are per rank by design, so no global-batch equivalence.
struct Plain : torch::nn::Module {
  Plain()
      : fc1(register_module("fc1", torch::nn::Linear(10, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

torch::Tensor flat_grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.grad().flatten().to(torch::kDouble));
  return torch::cat(parts);
}

torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten().to(torch::kDouble));
  return torch::cat(parts);
}

TEST(DDPForward, ForwardThroughTheWrapperBroadcastsBuffersInTrainingOnly) {
  const int r = rt().rank();
  auto net = std::make_shared<Net>();
  ddp::DistributedDataParallel model(pg(), net);
  ASSERT_TRUE(model.has_forward());
  net->eval();  // BatchNorm then reads its buffers and leaves them as they are
  auto drift = [&] {
    torch::NoGradGuard no_grad;
    net->norm->running_mean.fill_(static_cast<float>(r) + 0.5f);
  };
  drift();
  const torch::Tensor x = torch::randn({4, 10});
  model(x);  // grad mode on: the pre-forward work, buffers from rank 0
  EXPECT_EQ(net->norm->running_mean[0].item<float>(), 0.5f);
  drift();
  {
    torch::NoGradGuard no_grad;  // evaluation: nothing collective, buffers stay local
    model.forward(x);
  }
  EXPECT_EQ(net->norm->running_mean[0].item<float>(), static_cast<float>(r) + 0.5f);
}

TEST(DDPForward, ForwardThroughTheWrapperReattachesHooksAfterTorchLoad) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = std::make_shared<Plain>();
  ddp::DistributedDataParallel model(pg(), net);
  {
    // What torch::load(model, file) does to every parameter: new grad accumulators, no hooks.
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.set_(p.detach().clone());
  }
  const torch::Tensor x = torch::randn({8, 10}) + static_cast<float>(rt().rank());
  model(x).pow(2).sum().backward();  // no prepare_forward(): the wrapper's forward did it
  EXPECT_TRUE(identical_on_all_ranks(flat_grads(*net))) << "gradients were not averaged";
}

// A user who calls the module directly still gets averaged gradients: the hooks sit on the
// parameters. The reference: the mean over ranks of each rank's gradient.
TEST(DDPForward, CallingTheModuleDirectlyStillAveragesGradients) {
  const int w = rt().world_size(), r = rt().rank();
  torch::manual_seed(4);
  auto net = std::make_shared<Plain>();
  torch::manual_seed(4);
  auto reference = std::make_shared<Plain>();
  ddp::DistributedDataParallel model(pg(), net);
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({w, 6, 10});
  net->forward(x[r]).pow(2).mean().backward();
  torch::Tensor total = torch::zeros({});
  for (int k = 0; k < w; ++k) total = total + reference->forward(x[k]).pow(2).mean();
  (total / w).backward();
  EXPECT_TRUE(torch::allclose(flat_grads(*net), flat_grads(*reference), 1e-5, 1e-7));
  EXPECT_TRUE(identical_on_all_ranks(flat_grads(*net)));
  if (w > 1) {
    EXPECT_GT(model.sync_bytes(), 0);
  }
}

// What the docs promise for a user who bypasses the wrapper after torch::load: the hooks are
// gone, the ranks step on their own gradients, and the replica check names the first parameter
// that differs (--check-sync-every).
TEST(DDPForward, BypassingTheWrapperAfterTorchLoadIsCaughtByTheReplicaCheck) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = std::make_shared<Plain>();
  ddp::DistributedDataParallel model(pg(), net);
  {
    torch::NoGradGuard no_grad;  // torch::load's effect: new grad accumulators, no hooks
    for (auto& p : net->parameters()) p.set_(p.detach().clone());
  }
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor x = torch::randn({8, 10}) + static_cast<float>(rt().rank());
  net->forward(x).pow(2).sum().backward();  // the module directly: nothing re-attached
  opt.step();
  try {
    ddp::check_replicas_in_sync(*net, pg().cpu(), "after the step");
    FAIL() << "the replicas diverged but the check passed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
  }
}

TEST(DDPForward, AWrapperOfAPlainModulePointerHasNoForward) {
  std::shared_ptr<torch::nn::Module> plain = std::make_shared<Plain>();
  ddp::DistributedDataParallel model(pg(), plain);
  EXPECT_FALSE(model.has_forward());
  try {
    model(torch::ones({1, 10}));
    FAIL() << "no error";
  } catch (const std::logic_error& e) {
    // It names the module's type and the two ways out.
    const std::string what = e.what();
    EXPECT_NE(what.find("Plain"), std::string::npos) << what;
    EXPECT_NE(what.find("build the wrapper from std::shared_ptr<"), std::string::npos) << what;
    EXPECT_NE(what.find("prepare_forward()"), std::string::npos) << what;
  }
}

// The user's loop with everything: forward through the wrapper, N micro-batches with no_sync on
// the first N-1, clipping, then the step. After every step the model equals (a) the same ranks
// training on micro-batches N times larger without accumulation and (b) one process on the global
// batch of N * ranks * b samples; the replicas are bit-identical, the clipping norm is the same
// on every rank and equals the single process's, and the micro-batches under no_sync did not
// communicate.
TEST(DDPForward, AccumulationWithNoSyncAndClippingEqualOneProcessOnTheGlobalBatch) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t b = 2, micro = 3, steps = 3;
  const double max_norm = 0.05;  // small: every step clips
  torch::manual_seed(7);
  auto acc_net = std::make_shared<Plain>();
  torch::manual_seed(7);
  auto big_net = std::make_shared<Plain>();
  torch::manual_seed(7);
  auto reference = std::make_shared<Plain>();
  ddp::DistributedDataParallel accumulating(pg(), acc_net);
  ddp::DistributedDataParallel big(pg(), big_net);
  auto sgd = [](torch::nn::Module& m) {
    return torch::optim::SGD(m.parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  };
  torch::optim::SGD acc_opt = sgd(*acc_net), big_opt = sgd(*big_net), ref_opt = sgd(*reference);

  torch::manual_seed(8);
  // [step, micro-batch, rank * b, features]: rank r's samples of micro-batch m are rows r*b..
  const torch::Tensor x = torch::randn({steps, micro, w * b, 10});
  const torch::Tensor y = torch::randint(0, 3, {steps, micro, w * b}, torch::kLong);
  auto mine = [&](const torch::Tensor& t) { return t.slice(0, r * b, (r + 1) * b); };
  auto ce = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(out, target);
  };
  for (int64_t s = 0; s < steps; ++s) {
    acc_opt.zero_grad();
    for (int64_t m = 0; m < micro; ++m) {
      const bool last = m + 1 == micro;
      const int64_t bytes = accumulating.sync_bytes();
      if (!last) {
        auto no_sync = accumulating.no_sync();
        (ce(accumulating(mine(x[s][m])), mine(y[s][m])) / double(micro)).backward();
        EXPECT_EQ(accumulating.sync_bytes(), bytes) << "a no_sync backward communicated";
      } else {
        (ce(accumulating(mine(x[s][m])), mine(y[s][m])) / double(micro)).backward();
      }
    }
    const double acc_norm = ddp::clip_grad_norm(acc_net->parameters(), max_norm);
    acc_opt.step();

    // (a) one micro-batch N times larger per rank: this rank's rows of every micro-batch.
    big_opt.zero_grad();
    std::vector<torch::Tensor> xs, ys;
    for (int64_t m = 0; m < micro; ++m) {
      xs.push_back(mine(x[s][m]));
      ys.push_back(mine(y[s][m]));
    }
    ce(big(torch::cat(xs)), torch::cat(ys)).backward();
    const double big_norm = ddp::clip_grad_norm(big_net->parameters(), max_norm);
    big_opt.step();

    // (b) one process, every sample of the step.
    ref_opt.zero_grad();
    ce(reference->forward(x[s].reshape({-1, 10})), y[s].reshape({-1})).backward();
    const double ref_norm = ddp::clip_grad_norm(reference->parameters(), max_norm);
    ref_opt.step();

    EXPECT_NEAR(acc_norm, ref_norm, 1e-5 * ref_norm) << "step " << s;
    EXPECT_NEAR(big_norm, ref_norm, 1e-5 * ref_norm) << "step " << s;
    EXPECT_GT(ref_norm, max_norm) << "the test must clip";
    EXPECT_TRUE(identical_on_all_ranks(torch::tensor({acc_norm}, torch::kDouble)))
        << "clipping norms differ between ranks at step " << s;
    const torch::Tensor got = flat_params(*acc_net);
    EXPECT_TRUE(torch::allclose(got, flat_params(*big_net), 1e-5, 1e-6))
        << "step " << s << ": max diff to the big batch "
        << (got - flat_params(*big_net)).abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(got, flat_params(*reference), 1e-5, 1e-6))
        << "step " << s << ": max diff to one process "
        << (got - flat_params(*reference)).abs().max().item<double>();
    EXPECT_TRUE(identical_on_all_ranks(got)) << "replicas diverged at step " << s;
  }
}

// An inf in one rank's gradients (written there after the all-reduce, as a local unscale can
// produce) makes every rank skip the step and back off the scale; a clean step is taken by all.
TEST(GradScalerDistributed, EveryRankTakesTheSameOverflowDecision) {
  const int w = rt().world_size(), r = rt().rank();
  torch::Tensor p = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  ddp::GradScalerOptions options;
  options.init_scale = 8;
  ddp::GradScaler scaler(&pg().cpu(), options);
  // 1: the last rank (the only one at one rank) holds an inf.
  scaler.scale(torch::zeros({}));
  p.mutable_grad() = torch::full({3}, 8.0f);
  if (r == w - 1) p.mutable_grad()[1] = INFINITY;
  EXPECT_FALSE(scaler.step(opt)) << "rank " << r << " stepped";
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_TRUE(torch::equal(p.detach(), torch::ones({3})));
  // 2: clean everywhere: every rank steps.
  scaler.scale(torch::zeros({}));
  p.mutable_grad() = torch::full({3}, 4.0f);
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_TRUE(torch::allclose(p.detach(), torch::full({3}, 0.9f)));
  EXPECT_TRUE(identical_on_all_ranks(torch::tensor({scaler.get_scale()}, torch::kDouble)));
}

}  // namespace test_ddp_training_loop

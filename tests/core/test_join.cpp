// DistributedDataParallel::Join beyond the PyTorch reference (test_cnn_batchnorm_reference.cpp):
// the options it composes with, a rank that has no data at all, and the one misuse it names.
#include <ddp/distributed_data_parallel.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

namespace test_join {

using ddp_test::identical_on_all_ranks;

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

struct TwoLayers : torch::nn::Module {
  TwoLayers()
      : fc1(register_module("fc1", torch::nn::Linear(4, 3))),
        fc2(register_module("fc2", torch::nn::Linear(3, 2))),
        spare(register_module("spare", torch::nn::Linear(2, 2))) {}
  // Without `use_spare`, the parameters of `spare` get no gradient.
  torch::Tensor forward(const torch::Tensor& x, bool use_spare) {
    torch::Tensor y = fc2(torch::tanh(fc1(x)));
    return use_spare ? spare(y) : y;
  }
  torch::nn::Linear fc1, fc2, spare;
};

torch::Tensor input(int64_t step, int64_t rank) {
  return torch::sin(torch::arange(12, torch::kFloat).reshape({3, 4}) * 0.7 + step * 1.1 +
                    rank * 0.3);
}

torch::Tensor flat_grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) {
    parts.push_back(p.grad().defined() ? p.grad().flatten() : torch::zeros({p.numel()}));
  }
  return torch::cat(parts);
}

torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

// Rank r has r steps of data (rank 0 none); with find_unused_parameters odd ranks alone use
// `spare`. At step s the ranks r > s train, and each of them
// gets the average of their gradients, computed here by running every training rank's batch on
// a local copy of the model; after finish() every rank holds the last rank's model.
TEST(Join, RanksThatRunOutShadowTheOthersUnderEveryOption) {
  const int w = rt().world_size(), r = rt().rank();
  for (bool find_unused : {false, true}) {
    for (bool view : {false, true}) {
      SCOPED_TRACE("find_unused_parameters " + std::to_string(find_unused) +
                   ", gradient_as_bucket_view " + std::to_string(view));
      // With find_unused_parameters, `spare` is used by odd ranks only.
      auto uses_spare = [&](int64_t rank) { return !find_unused || rank % 2 == 1; };
      torch::manual_seed(7);
      auto net = std::make_shared<TwoLayers>();
      auto local = std::make_shared<TwoLayers>();  // the expected gradients' model
      ddp::DDPOptions options;
      options.find_unused_parameters = find_unused;
      options.gradient_as_bucket_view = view;
      options.reducer_at_one_rank = true;
      options.first_bucket_mb = 1e-9;  // several buckets
      ddp::DistributedDataParallel model(pg(), net, options);
      torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
      auto join = model.join();
      for (int64_t s = 0; s < r; ++s) {
        {
          torch::NoGradGuard no_grad;
          for (size_t k = 0; k < net->parameters().size(); ++k)
            local->parameters()[k].copy_(net->parameters()[k]);
        }
        // The average over the training ranks; a parameter no training rank used keeps no grad.
        local->zero_grad();
        for (int64_t q = s + 1; q < w; ++q) {
          (local->forward(input(s, q), uses_spare(q)).sum() / static_cast<double>(w - 1 - s))
              .backward();
        }
        optimizer.zero_grad();
        model.forward(input(s, r), uses_spare(r)).sum().backward();
        EXPECT_TRUE(torch::allclose(flat_grads(*net), flat_grads(*local), 1e-5, 1e-6))
            << "rank " << r << ", step " << s;
        optimizer.step();
      }
      join.finish();
      EXPECT_EQ(join.shadowed_steps(), (w - 1) - r);
      EXPECT_TRUE(identical_on_all_ranks(flat_params(*net)));
    }
  }
}

// Ranks that train must agree on no_sync(): a step that some synchronise and others do not is an
// error on every rank, not a hang.
TEST(Join, NoSyncOnSomeTrainingRanksOnlyIsNamed) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  auto net = std::make_shared<TwoLayers>();
  ddp::DistributedDataParallel model(pg(), net);
  auto join = model.join();
  auto forward = [&] { model.forward(input(0, rt().rank()), true); };
  try {
    if (rt().rank() == 0) {
      auto guard = model.no_sync();
      forward();
    } else {
      forward();
    }
    ADD_FAILURE() << "no error on rank " << rt().rank();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("use no_sync() on every rank or none"), std::string::npos)
        << e.what();
  }
}

// Under join() each training forward tells the other ranks whether its backward synchronises.
// With no_sync() taken before the forward (PyTorch's way) the first micro-batch accumulates
// locally; taken after it, the forward has announced a synchronised backward, so the backward
// synchronises anyway (with one warning) and every rank makes the same collectives: before
// this rule the ranks that had run out waited in a gradient all-reduce the others never made.
// Either way each training rank holds the average of the training ranks' accumulated gradients.
TEST(Join, TheForwardDecidesWhetherAnAccumulatingBackwardSynchronises) {
  const int w = rt().world_size(), r = rt().rank();
  for (bool guard_before_forward : {true, false}) {
    SCOPED_TRACE("no_sync() taken " + std::string(guard_before_forward ? "before" : "after") +
                 " the forward");
    torch::manual_seed(7);
    auto net = std::make_shared<TwoLayers>();
    auto local = std::make_shared<TwoLayers>();  // the expected gradients' model
    int64_t all_bytes = 0;                       // of one synchronised backward
    for (const auto& p : net->parameters()) all_bytes += p.numel() * p.element_size();
    ddp::DDPOptions options;
    options.reducer_at_one_rank = true;
    ddp::DistributedDataParallel model(pg(), net, options);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
    testing::internal::CaptureStderr();
    auto join = model.join();
    for (int64_t s = 0; s <= r; ++s) {  // rank r has r + 1 steps of 2 micro-batches
      {
        torch::NoGradGuard no_grad;
        for (size_t k = 0; k < net->parameters().size(); ++k)
          local->parameters()[k].copy_(net->parameters()[k]);
      }
      local->zero_grad();
      for (int64_t q = s; q < w; ++q) {
        for (int64_t m = 0; m < 2; ++m) {
          (local->forward(input(2 * s + m, q), true).sum() / static_cast<double>(w - s)).backward();
        }
      }
      optimizer.zero_grad();
      const int64_t bytes_before = model.sync_bytes();
      auto loss = [&](int64_t m) { return model.forward(input(2 * s + m, r), true).sum(); };
      if (guard_before_forward) {
        auto guard = model.no_sync();
        loss(0).backward();
      } else {
        torch::Tensor first = loss(0);
        auto guard = model.no_sync();
        first.backward();
      }
      loss(1).backward();
      EXPECT_EQ(model.sync_bytes() - bytes_before, (guard_before_forward ? 1 : 2) * all_bytes)
          << "rank " << r << ", step " << s;
      EXPECT_TRUE(torch::allclose(flat_grads(*net), flat_grads(*local), 1e-5, 1e-6))
          << "rank " << r << ", step " << s;
      optimizer.step();
    }
    join.finish();
    const std::string printed = testing::internal::GetCapturedStderr();
    const size_t warning = printed.find("Take the guard before the forward");
    if (guard_before_forward) {
      EXPECT_EQ(warning, std::string::npos) << printed;
    } else {
      EXPECT_NE(warning, std::string::npos) << printed;
      EXPECT_EQ(printed.find("Take the guard before the forward", warning + 1), std::string::npos)
          << "warned more than once: " << printed;
    }
    EXPECT_TRUE(identical_on_all_ranks(flat_params(*net)));
  }
}

}  // namespace test_join

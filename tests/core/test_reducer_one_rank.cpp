// DDPOptions::reducer_at_one_rank: at one rank the Reducer's whole bucket path (hooks, buckets,
// the backend's all-reduce, rebuild_buckets, no_sync(), find_unused_parameters) runs and changes
// nothing: every step's loss and the weights after the steps are bit-identical to a plain step's.
// With more ranks the option changes nothing either. On the CPU at 1, 2 and 4 ranks, so the path
// that one GPU uses to prove the NCCL reducer (tests/gpu/test_gpu_ddp.cpp) cannot rot.
#include <ddp/distributed_data_parallel.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace test_reducer_one_rank {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

// Registered in another order than used (so rebuild_buckets regroups the buckets), with a head
// that a step may leave out (an unused parameter).
struct Branchy : torch::nn::Module {
  Branchy()
      : out(register_module("out", torch::nn::Linear(32, 3))),
        in(register_module("in", torch::nn::Linear(10, 32))),
        mid(register_module("mid", torch::nn::Linear(32, 32))),
        extra(register_module("extra", torch::nn::Linear(32, 3))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_extra) {
    const torch::Tensor h = torch::relu(mid(torch::tanh(in(x))));
    return use_extra ? out(h) + extra(h) : out(h);
  }
  torch::nn::Linear out, in, mid, extra;
};

struct Variant {
  const char* name;
  ddp::DDPOptions options;
  int64_t micro_batches = 1;  // > 1: all but the last backward inside no_sync()
  bool skip_extra = false;    // odd steps leave `extra` out (on every rank)
};

struct Trained {
  std::vector<torch::Tensor> losses;
  torch::Tensor weights;  // every parameter, flattened, after the steps
  std::vector<std::vector<size_t>> layout_before, layout_after;
  int64_t sync_bytes = 0;
};

// Five SGD steps with momentum on this rank's own data (different on every rank).
Trained train(const Variant& v, bool reducer_at_one_rank) {
  ddp::DDPOptions options = v.options;
  options.reducer_at_one_rank = reducer_at_one_rank;
  torch::manual_seed(41);
  auto net = std::make_shared<Branchy>();
  ddp::DistributedDataParallel model(pg(), net, options);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(42 + rt().rank());
  const int64_t steps = 5, batch = 4;
  const torch::Tensor x = torch::randn({steps, v.micro_batches, batch, 10});
  const torch::Tensor y = torch::randint(0, 3, {steps, v.micro_batches, batch}, torch::kLong);
  Trained run;
  run.layout_before = model.bucket_layout();
  for (int64_t s = 0; s < steps; ++s) {
    optimizer.zero_grad();
    const bool use_extra = !(v.skip_extra && s % 2 == 1);
    for (int64_t m = 0; m < v.micro_batches; ++m) {
      const torch::Tensor loss =
          torch::nn::functional::cross_entropy(model.forward(x[s][m], use_extra), y[s][m]) /
          static_cast<double>(v.micro_batches);
      run.losses.push_back(loss.detach());
      if (m + 1 < v.micro_batches) {
        auto guard = model.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    optimizer.step();
    if (s == 0) run.layout_after = model.bucket_layout();
  }
  std::vector<torch::Tensor> parts;
  for (const auto& p : net->parameters()) parts.push_back(p.detach().flatten());
  run.weights = torch::cat(parts);
  run.sync_bytes = model.sync_bytes();
  return run;
}

std::vector<Variant> variants() {
  auto with = [](auto change) {
    ddp::DDPOptions o;
    o.first_bucket_mb = o.bucket_cap_mb = 1e-6;  // a bucket per parameter, so rebuilds show
    change(o);
    return o;
  };
  return {
      {"rebuild_buckets", with([](auto&) {})},
      {"rebuild_buckets off", with([](auto& o) { o.rebuild_buckets = false; })},
      {"default buckets", ddp::DDPOptions{}},
      {"a bucket per parameter", with([](auto& o) {
         o.bucket_cap_mb = o.first_bucket_mb = 1e-9;
         o.rebuild_buckets = false;
       })},
      {"no_sync accumulation", with([](auto&) {}), 3},
      {"find_unused_parameters", with([](auto& o) { o.find_unused_parameters = true; }), 1, true},
      {"no_sync and unused", with([](auto& o) { o.find_unused_parameters = true; }), 2, true},
  };
}

// At one rank the option's run equals the run without a Reducer (a plain step) bit for bit; at
// more ranks the option changes nothing, the Reducer being there either way.
TEST(ReducerAtOneRank, StepsAreBitIdenticalToThoseWithoutIt) {
  const bool one = rt().world_size() == 1;
  for (const Variant& v : variants()) {
    const Trained plain = train(v, false), with = train(v, true);
    ASSERT_EQ(plain.losses.size(), with.losses.size()) << v.name;
    for (size_t i = 0; i < plain.losses.size(); ++i) {
      EXPECT_TRUE(torch::equal(plain.losses[i], with.losses[i]))
          << v.name << ", backward " << i << ": " << plain.losses[i].item<double>() << " vs "
          << with.losses[i].item<double>();
    }
    EXPECT_TRUE(torch::equal(plain.weights, with.weights))
        << v.name << ": max diff " << (plain.weights - with.weights).abs().max().item<double>();
    // The option really built a Reducer at one rank, and it all-reduced the gradients.
    EXPECT_FALSE(with.layout_before.empty()) << v.name;
    EXPECT_GT(with.sync_bytes, 0) << v.name;
    EXPECT_EQ(plain.layout_before.empty(), one) << v.name;
    if (!one) {
      EXPECT_EQ(plain.layout_after, with.layout_after) << v.name;
      EXPECT_EQ(plain.sync_bytes, with.sync_bytes) << v.name;
    }
  }
}

// The rebuild (step 5 of reducer.h) runs at one rank: after the first backward the buckets follow
// the order the gradients arrived in (out and extra first), not reverse registration order.
TEST(ReducerAtOneRank, BucketsAreRebuiltAfterTheFirstBackward) {
  for (const Variant& v : variants()) {
    const std::string name = v.name;
    if (name != "rebuild_buckets" && name != "rebuild_buckets off") continue;
    const Trained run = train(v, true);
    ASSERT_EQ(run.layout_before.size(), 8u) << name;  // a bucket per parameter
    // Registration: out (0, 1), in (2, 3), mid (4, 5), extra (6, 7); reverse order first.
    EXPECT_EQ(run.layout_before.front(), std::vector<size_t>{7}) << name;
    if (name == "rebuild_buckets") {
      EXPECT_NE(run.layout_after, run.layout_before) << name;
      // `in` is the first layer: its gradients arrive last.
      EXPECT_TRUE(run.layout_after.back() == std::vector<size_t>{2} ||
                  run.layout_after.back() == std::vector<size_t>{3})
          << name;
    } else {
      EXPECT_EQ(run.layout_after, run.layout_before) << name;
    }
  }
}

// As with more ranks, a parameter without a gradient is an error naming it, unless
// find_unused_parameters: the unused-parameter check runs at one rank too.
TEST(ReducerAtOneRank, UnusedParameterIsAnErrorAsWithMoreRanks) {
  auto net = std::make_shared<Branchy>();
  ddp::DDPOptions options;
  options.reducer_at_one_rank = true;
  ddp::DistributedDataParallel model(pg(), net, options);
  const torch::Tensor x = torch::ones({2, 10});
  try {
    model.forward(x, false).sum().backward();
    FAIL() << "no exception on rank " << rt().rank();
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'extra.weight' (rank "), std::string::npos) << msg;
    EXPECT_NE(msg.find("find_unused_parameters"), std::string::npos) << msg;
  }
}

}  // namespace test_reducer_one_rank

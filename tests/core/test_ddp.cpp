#include <ddp/distributed_data_parallel.h>
#include <ddp/timeline.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

namespace test_ddp {

using ddp_test::identical_on_all_ranks;

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

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

TEST(DistributedDataParallel, ConstructionBroadcastsParametersAndBuffers) {
  torch::manual_seed(100 + rt().rank());  // a different initialisation on every rank
  auto net = std::make_shared<Mlp>();
  {
    torch::NoGradGuard no_grad;
    net->norm->running_mean.fill_(static_cast<float>(rt().rank()));
  }
  ddp::DistributedDataParallel model(pg(), net);
  EXPECT_TRUE(identical_on_all_ranks(flat_state(*net)));
  EXPECT_EQ(net->norm->running_mean[0].item<float>(), 0.0f);  // rank 0's buffer
}

TEST(DistributedDataParallel, PrepareForwardBroadcastsRankZerosBuffersUnlessTurnedOff) {
  for (bool broadcast : {true, false}) {
    auto net = std::make_shared<Mlp>();
    ddp::DDPOptions options;
    options.broadcast_buffers = broadcast;
    ddp::DistributedDataParallel model(pg(), net, options);
    {
      torch::NoGradGuard no_grad;  // local statistics drift apart, as BatchNorm's do in training
      net->norm->running_mean.fill_(static_cast<float>(rt().rank()) + 0.5f);
      net->norm->running_var.fill_(static_cast<float>(rt().rank()) * 2.0f + 1.0f);
      net->norm->num_batches_tracked.fill_(rt().rank() + 7);
    }
    model.prepare_forward();
    EXPECT_EQ(net->norm->running_mean[3].item<float>(), broadcast ? 0.5f : rt().rank() + 0.5f);
    EXPECT_EQ(net->norm->running_var[0].item<float>(),
              broadcast ? 1.0f : rt().rank() * 2.0f + 1.0f);
    EXPECT_EQ(net->norm->num_batches_tracked.item<int64_t>(), broadcast ? 7 : rt().rank() + 7);
    if (broadcast) {
      EXPECT_TRUE(identical_on_all_ranks(flat_state(*net)));
    }
  }
}

TEST(DistributedDataParallel, PrepareForwardReattachesHooksAfterStorageSwaps) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = std::make_shared<Mlp>();
  ddp::DistributedDataParallel model(pg(), net);
  {
    // What torch::load(model, file) does to every parameter: autograd then gives each a new
    // grad accumulator, without the reducer's hook.
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.set_(p.detach().clone());
  }
  model.prepare_forward();
  torch::Tensor x = torch::randn({8, 10}) + static_cast<float>(rt().rank());  // differs per rank
  net->forward(x).pow(2).sum().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().flatten());
  EXPECT_TRUE(identical_on_all_ranks(torch::cat(grads))) << "gradients were not averaged";
}

TEST(DistributedDataParallel, ShapeMismatchFailsOnEveryRankNamingIt) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = std::make_shared<Mlp>(rt().rank() == 1 ? 17 : 16);
  try {
    ddp::DistributedDataParallel model(pg(), net);
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
  EXPECT_THROW(ddp::DistributedDataParallel(pg(), net), std::runtime_error);
}

// A model whose parameters are registered in an order different from their use, so gradients
// arrive out of bucket order.
struct Shuffled : torch::nn::Module {
  Shuffled()
      : out(register_module("out", torch::nn::Linear(32, 3))),
        in(register_module("in", torch::nn::Linear(10, 32))),
        mid(register_module("mid", torch::nn::Linear(32, 32))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::relu(mid(torch::tanh(in(x)))));
  }
  torch::nn::Linear out, in, mid;
};

struct Config {
  const char* name;
  ddp::DDPOptions options;
  double tolerance;                   // on parameters after the steps
  ddp::CommHook (*hook)() = nullptr;  // registered when set
};

// The benchmarks' per-parameter baseline: caps below every parameter's size, no rebuild.
ddp::DDPOptions per_parameter() {
  ddp::DDPOptions options;
  options.bucket_cap_mb = options.first_bucket_mb = 1e-9;
  options.rebuild_buckets = false;
  return options;
}

std::vector<Config> configs() {
  auto with = [](auto change) {
    ddp::DDPOptions o;
    change(o);
    return o;
  };
  return {
      {"default buckets", {}, 1e-6},
      {"cap below one parameter", with([](auto& o) { o.bucket_cap_mb = o.first_bucket_mb = 1e-4; }),
       1e-6},
      {"cap above the model", with([](auto& o) { o.bucket_cap_mb = o.first_bucket_mb = 1000; }),
       1e-6},
      {"three small buckets", with([](auto& o) {
         o.first_bucket_mb = 0.0005;
         o.bucket_cap_mb = 0.003;
       }),
       1e-6},
      {"a bucket per parameter", per_parameter(), 1e-6},
      {"fp16 on the wire", {}, 2e-3, ddp::fp16_compress_hook},
      {"bf16 on the wire", {}, 2e-2, ddp::bf16_compress_hook},
  };
}

// N ranks with batch b train exactly like one process with batch N*b: after every step each
// rank's parameters equal the single-process reference (within the tolerance of the wire
// format) and are bit-identical across ranks. No dropout, no BatchNorm (its batch statistics
// are per rank by design).
TEST(DistributedDataParallel, EquivalentToOneProcessOnTheGlobalBatch) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t b = 4, steps = 5;
  for (const Config& config : configs()) {
    torch::manual_seed(3);
    auto distributed = std::make_shared<Shuffled>();
    torch::manual_seed(3);
    auto reference = std::make_shared<Shuffled>();
    ddp::DistributedDataParallel model(pg(), distributed, config.options);
    if (config.hook) model.register_comm_hook(config.hook());
    torch::optim::SGD opt(distributed->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

    torch::manual_seed(11);
    const torch::Tensor x = torch::randn({steps, w * b, 10});
    const torch::Tensor y = torch::randint(0, 3, {steps, w * b}, torch::kLong);
    for (int64_t s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::Tensor mine = x[s].slice(0, r * b, (r + 1) * b);
      torch::nn::functional::cross_entropy(distributed->forward(mine),
                                           y[s].slice(0, r * b, (r + 1) * b))
          .backward();
      opt.step();

      ref_opt.zero_grad();
      torch::nn::functional::cross_entropy(reference->forward(x[s]), y[s]).backward();
      ref_opt.step();

      const torch::Tensor got = flat_state(*distributed), want = flat_state(*reference);
      EXPECT_TRUE(torch::allclose(got, want, config.tolerance, config.tolerance))
          << config.name << ", step " << s << ": max diff "
          << (got - want).abs().max().item<double>();
      EXPECT_TRUE(identical_on_all_ranks(got))
          << config.name << ": replicas diverged at step " << s;
    }
    if (w > 1) {
      int64_t param_bytes = 0;
      for (const auto& p : distributed->parameters()) param_bytes += p.numel() * 4;
      EXPECT_EQ(model.sync_bytes(), steps * param_bytes) << config.name;
      EXPECT_GT(model.sync_seconds(), 0.0) << config.name;
    }
  }
}

TEST(DistributedDataParallel, BucketsFollowReverseRegistrationOrderAndCaps) {
  if (rt().world_size() < 2) GTEST_SKIP() << "one rank has no reducer";
  auto net = std::make_shared<Shuffled>();  // out(w,b) in(w,b) mid(w,b): indices 0..5
  ddp::DDPOptions all_in_one;
  all_in_one.first_bucket_mb = all_in_one.bucket_cap_mb = 1000;
  EXPECT_EQ(ddp::DistributedDataParallel(pg(), net, all_in_one).bucket_layout(),
            (std::vector<std::vector<size_t>>{{5, 4, 3, 2, 1, 0}}));
  ddp::DDPOptions tiny;
  tiny.first_bucket_mb = tiny.bucket_cap_mb = 1e-6;
  EXPECT_EQ(ddp::DistributedDataParallel(pg(), net, tiny).bucket_layout(),
            (std::vector<std::vector<size_t>>{{5}, {4}, {3}, {2}, {1}, {0}}));
  // Bytes: mid.bias 128, mid.weight 4096, in.bias 128, in.weight 1280, out.bias 12, out.weight
  // 384. A 5 KiB first bucket takes the first three; in.weight exceeds a 1 KiB cap alone.
  ddp::DDPOptions mixed;
  mixed.first_bucket_mb = 5.0 / 1024;
  mixed.bucket_cap_mb = 1.0 / 1024;
  EXPECT_EQ(ddp::DistributedDataParallel(pg(), net, mixed).bucket_layout(),
            (std::vector<std::vector<size_t>>{{5, 4, 3}, {2}, {1, 0}}));
  // A parameter of at least first_bucket_mb closes its bucket: mid.weight (4 KiB) with a 4 KiB
  // first bucket and a large cap.
  ddp::DDPOptions large_alone;
  large_alone.first_bucket_mb = 4.0 / 1024;
  large_alone.bucket_cap_mb = 1000;
  EXPECT_EQ(ddp::DistributedDataParallel(pg(), net, large_alone).bucket_layout(),
            (std::vector<std::vector<size_t>>{{5}, {4}, {3, 2, 1, 0}}));
}

TEST(DistributedDataParallel, DifferentBucketOptionsAcrossRanksAreRejected) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = std::make_shared<Shuffled>();
  ddp::DDPOptions options;
  if (rt().rank() == 1) options.bucket_cap_mb = options.first_bucket_mb = 1e-6;
  try {
    ddp::DistributedDataParallel model(pg(), net, options);
    FAIL() << "no exception on rank " << rt().rank();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket layouts differ"), std::string::npos) << e.what();
  }
}

using Layout = std::vector<std::vector<size_t>>;

// Every parameter's grad equals the reference's and is bit-identical across ranks.
void expect_grads_match(torch::nn::Module& distributed, torch::nn::Module& reference,
                        const std::string& what) {
  auto want = reference.named_parameters();
  for (const auto& p : distributed.named_parameters()) {
    const torch::Tensor got = p.value().grad(), expected = want[p.key()].grad();
    EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-6))
        << what << ", " << p.key() << ": max diff " << (got - expected).abs().max().item<double>();
    EXPECT_TRUE(identical_on_all_ranks(got)) << what << ", " << p.key();
  }
}

// Backward produces Shuffled's gradients in the order out.bias 12 bytes, out.weight 384,
// mid.bias 128, mid.weight 4096, in.bias 128, in.weight 1280. With a 512-byte first bucket and a
// 1.5 KiB cap, that order and reverse registration order give different layouts.
ddp::DDPOptions small_buckets() {
  ddp::DDPOptions options;
  options.first_bucket_mb = 0.5 / 1024;
  options.bucket_cap_mb = 1.5 / 1024;
  return options;
}
const Layout kRegistered = {{5}, {4}, {3, 2}, {1, 0}};
const Layout kObserved = {{1, 0}, {5}, {4}, {3, 2}};

TEST(DistributedDataParallel, BucketsAreRebuiltInTheOrderGradientsArrived) {
  const int w = rt().world_size(), r = rt().rank();
  if (w < 2) GTEST_SKIP() << "one rank has no reducer";
  const int64_t b = 2;
  auto mine = [&](const torch::Tensor& global) { return global.slice(0, r * b, (r + 1) * b); };
  struct Case {
    const char* name;
    bool rebuild;
    bool one_per_bucket;  // caps below every parameter's size
    Layout before, after;
  };
  const Layout one_each = {{5}, {4}, {3}, {2}, {1}, {0}};
  const Layout one_each_observed = {{1}, {0}, {5}, {4}, {3}, {2}};
  for (const Case& c :
       {Case{"rebuild", true, false, kRegistered, kObserved},
        Case{"rebuild_buckets off", false, false, kRegistered, kRegistered},
        Case{"a bucket per parameter, rebuilt", true, true, one_each, one_each_observed},
        Case{"a bucket per parameter, not rebuilt", false, true, one_each, one_each}}) {
    torch::manual_seed(31);
    auto distributed = std::make_shared<Shuffled>();
    torch::manual_seed(31);
    auto reference = std::make_shared<Shuffled>();
    ddp::DDPOptions options = c.one_per_bucket ? per_parameter() : small_buckets();
    options.rebuild_buckets = c.rebuild;
    ddp::DistributedDataParallel model(pg(), distributed, options);
    EXPECT_EQ(model.bucket_layout(), c.before) << c.name;
    torch::manual_seed(32);
    const torch::Tensor x = torch::randn({2, w * b, 10});
    const torch::Tensor y = torch::randint(0, 3, {2, w * b}, torch::kLong);
    for (int64_t step = 0; step < 2; ++step) {
      distributed->zero_grad();
      reference->zero_grad();
      const std::string what = std::string(c.name) + ", step " + std::to_string(step);
      torch::nn::functional::cross_entropy(distributed->forward(mine(x[step])), mine(y[step]))
          .backward();
      torch::nn::functional::cross_entropy(reference->forward(x[step]), y[step]).backward();
      EXPECT_EQ(model.bucket_layout(), c.after) << what;
      expect_grads_match(*distributed, *reference, what);
    }
  }
}

TEST(DistributedDataParallel, BucketsAreRebuiltAfterTheFirstSynchronisedBackwardOnly) {
  const int w = rt().world_size(), r = rt().rank();
  if (w < 2) GTEST_SKIP() << "one rank has no reducer";
  const int64_t b = 2;
  torch::manual_seed(33);
  auto distributed = std::make_shared<Shuffled>();
  torch::manual_seed(33);
  auto reference = std::make_shared<Shuffled>();
  ddp::DistributedDataParallel model(pg(), distributed, small_buckets());
  torch::manual_seed(34);
  const torch::Tensor x = torch::randn({2, w * b, 10});
  const torch::Tensor y = torch::randint(0, 3, {2, w * b}, torch::kLong);
  auto loss = [&](int64_t step) {
    auto mine = [&](const torch::Tensor& global) { return global.slice(0, r * b, (r + 1) * b); };
    return torch::nn::functional::cross_entropy(distributed->forward(mine(x[step])), mine(y[step]));
  };
  {
    auto guard = model.no_sync();
    loss(0).backward();
  }
  EXPECT_EQ(model.bucket_layout(), kRegistered);
  loss(1).backward();
  EXPECT_EQ(model.bucket_layout(), kObserved);
  for (int64_t step = 0; step < 2; ++step) {
    torch::nn::functional::cross_entropy(reference->forward(x[step]), y[step]).backward();
  }
  expect_grads_match(*distributed, *reference, "no_sync, then a synchronised backward");
}

// Two layers applied in an order that depends on the rank's parity, so the ranks see their
// gradients arrive in different orders.
struct RankOrdered : torch::nn::Module {
  RankOrdered()
      : a(register_module("a", torch::nn::Linear(6, 6))),
        b(register_module("b", torch::nn::Linear(6, 6))) {}
  torch::Tensor forward(const torch::Tensor& x, bool a_last) {
    return a_last ? a(torch::tanh(b(x))) : b(torch::tanh(a(x)));
  }
  torch::nn::Linear a, b;
};

TEST(DistributedDataParallel, RebuiltBucketsFollowRankZerosOrderOnEveryRank) {
  const int w = rt().world_size(), r = rt().rank();
  if (w < 2) GTEST_SKIP() << "one rank has no reducer";
  torch::manual_seed(35);
  auto distributed = std::make_shared<RankOrdered>();
  torch::manual_seed(35);
  auto reference = std::make_shared<RankOrdered>();
  ddp::DDPOptions options;
  options.first_bucket_mb = options.bucket_cap_mb = 1e-6;  // one parameter per bucket
  ddp::DistributedDataParallel model(pg(), distributed, options);
  EXPECT_EQ(model.bucket_layout(), (Layout{{3}, {2}, {1}, {0}}));
  torch::manual_seed(36);
  const torch::Tensor x = torch::randn({3, w, 2, 6});
  for (int64_t step = 0; step < 3; ++step) {
    distributed->zero_grad();
    reference->zero_grad();
    // Even ranks get a's gradients first; odd ranks b's, as reverse registration order guesses.
    distributed->forward(x[step][r], r % 2 == 0).pow(2).mean().backward();
    torch::Tensor total = torch::zeros({});
    for (int k = 0; k < w; ++k) {
      total = total + reference->forward(x[step][k], k % 2 == 0).pow(2).mean();
    }
    (total / w).backward();
    // Rank 0's order on every rank.
    EXPECT_EQ(model.bucket_layout(), (Layout{{1}, {0}, {3}, {2}}))
        << "rank " << r << ", step " << step;
    expect_grads_match(*distributed, *reference, "step " + std::to_string(step));
  }
}

// k backward passes, all but the last under no_sync(), then one step: the same as one process
// taking one step on the k*N*b samples.
TEST(DistributedDataParallel, NoSyncAccumulatesLikeOneBigBatch) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t b = 3, k = 3;
  for (const ddp::DDPOptions& sync : {ddp::DDPOptions(), per_parameter()}) {
    torch::manual_seed(21);
    auto distributed = std::make_shared<Shuffled>();
    torch::manual_seed(21);
    auto reference = std::make_shared<Shuffled>();
    ddp::DDPOptions options = sync;
    ddp::DistributedDataParallel model(pg(), distributed, options);
    torch::manual_seed(22);
    const torch::Tensor x = torch::randn({k, w * b, 10});
    const torch::Tensor y = torch::randint(0, 3, {k, w * b}, torch::kLong);
    const int64_t bytes_before = model.sync_bytes();
    for (int64_t step = 0; step < k; ++step) {
      auto loss = [&] {
        return torch::nn::functional::cross_entropy(
                   distributed->forward(x[step].slice(0, r * b, (r + 1) * b)),
                   y[step].slice(0, r * b, (r + 1) * b)) /
               static_cast<double>(k);
      };
      if (step + 1 < k) {
        auto guard = model.no_sync();
        loss().backward();
      } else {
        loss().backward();
      }
    }
    if (w > 1) {
      EXPECT_GT(model.sync_bytes(), bytes_before);
    }
    torch::nn::functional::cross_entropy(reference->forward(x.reshape({k * w * b, 10})),
                                         y.reshape({-1}))
        .backward();
    for (size_t i = 0; i < distributed->parameters().size(); ++i) {
      const torch::Tensor got = distributed->parameters()[i].grad();
      const torch::Tensor want = reference->parameters()[i].grad();
      EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6))
          << "parameter " << i << " max diff " << (got - want).abs().max().item<double>();
      EXPECT_TRUE(identical_on_all_ranks(got));
    }
  }
}

// A head that only some ranks use in a step.
struct TwoHeads : torch::nn::Module {
  TwoHeads()
      : body(register_module("body", torch::nn::Linear(4, 4))),
        head(register_module("head", torch::nn::Linear(4, 2))),
        extra(register_module("extra", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_extra) {
    torch::Tensor h = torch::relu(body(x));
    return use_extra ? head(h) + extra(h) : head(h);
  }
  torch::nn::Linear body, head, extra;
};

TEST(DistributedDataParallel, UnusedParameterIsAnErrorOnEveryRankNamingIt) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (const ddp::DDPOptions& sync : {ddp::DDPOptions(), per_parameter()}) {
    auto net = std::make_shared<TwoHeads>();
    ddp::DDPOptions options = sync;
    ddp::DistributedDataParallel model(pg(), net, options);
    const torch::Tensor x = torch::ones({2, 4});
    try {
      net->forward(x, /*use_extra=*/rt().rank() != 1).sum().backward();
      FAIL() << "no exception on rank " << rt().rank();
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("2 parameter(s) got no gradient"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'extra.weight' (rank 1)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("find_unused_parameters"), std::string::npos) << msg;
    }
    // The reducer is usable again afterwards.
    net->zero_grad();
    net->forward(x, true).sum().backward();
    EXPECT_TRUE(identical_on_all_ranks(net->extra->weight.grad()));
  }
}

TEST(DistributedDataParallel, FindUnusedParametersCountsThemAsZero) {
  const int w = rt().world_size(), r = rt().rank();
  for (const ddp::DDPOptions& sync : {ddp::DDPOptions(), per_parameter()}) {
    torch::manual_seed(8);
    auto net = std::make_shared<TwoHeads>();
    torch::manual_seed(8);
    auto reference = std::make_shared<TwoHeads>();
    ddp::DDPOptions options = sync;
    options.find_unused_parameters = true;
    ddp::DistributedDataParallel model(pg(), net, options);
    torch::manual_seed(9);
    const torch::Tensor x = torch::randn({w, 2, 4});
    // Only rank 0 uses `extra`; the reference sums what every rank computes, over ranks.
    net->forward(x[r], r == 0).pow(2).mean().backward();
    torch::Tensor total = torch::zeros({});
    for (int k = 0; k < w; ++k) total = total + reference->forward(x[k], k == 0).pow(2).mean();
    (total / w).backward();
    for (const char* name : {"body.weight", "head.weight", "extra.weight", "extra.bias"}) {
      const torch::Tensor got = net->named_parameters()[name].grad();
      const torch::Tensor want = reference->named_parameters()[name].grad();
      ASSERT_TRUE(got.defined()) << name;
      EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6)) << name << " " << got << want;
    }
    // Used by no rank: grad stays as it was (undefined).
    net->zero_grad();
    for (auto& p : net->extra->parameters()) p.mutable_grad() = torch::Tensor();
    net->forward(x[r], false).sum().backward();
    EXPECT_FALSE(net->extra->weight.grad().defined());
    EXPECT_TRUE(net->head->weight.grad().defined());
  }
}

TEST(DistributedDataParallel, TimelineRecordsBucketAllReduces) {
  if (rt().world_size() < 2) GTEST_SKIP() << "one rank has no reducer";
  ddp::Timeline timeline(pg().cpu());
  ddp::DDPOptions options;
  options.timeline = &timeline;
  options.first_bucket_mb = options.bucket_cap_mb = 1e-6;  // one bucket per parameter
  auto net = std::make_shared<Shuffled>();
  ddp::DistributedDataParallel model(pg(), net, options);
  net->forward(torch::ones({2, 10})).sum().backward();
  EXPECT_EQ(timeline.size(), 6u * 2 + 1);  // queued + all-reduce per bucket, one wait
  // One file per world size: ctest -j runs distributed_np2 and _np4 at the same time.
  const std::string path =
      std::string(DDP_TEST_TMP) + "/timeline_np" + std::to_string(rt().world_size()) + ".json";
  timeline.write(path);
  if (rt().is_main()) {
    const std::string summary = ddp_test::run_command(
        std::string(DDP_PYTHON) + " -c \"import json,sys; t=json.load(open('" + path +
        "'))['traceEvents']; print(len({e['pid'] for e in t}), sum('all-reduce bucket' in "
        "e['name'] for e in t))\"");
    EXPECT_EQ(summary, std::to_string(rt().world_size()) + " " +
                           std::to_string(6 * rt().world_size()) + "\n");
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
  ddp::DistributedDataParallel model(pg(), net.ptr());
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
  { ddp::DistributedDataParallel model(pg(), net.ptr()); }
  // Only this rank runs backward: with hooks left behind it would wait for the others forever.
  if (rt().is_main()) {
    net->forward(torch::ones({1, 3})).sum().backward();
    EXPECT_TRUE(torch::allclose(net->weight.grad(), torch::ones({1, 3})));
  }
}

}  // namespace test_ddp

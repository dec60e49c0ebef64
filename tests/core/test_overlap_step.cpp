// hook_then_optimizer at the number of ranks the binary runs with (ctest: 1, 2, 4; at one rank
// with DDPOptions::reducer_at_one_rank): the optimizer stepped bucket by bucket inside backward
// leaves the same parameters, bit for bit, as optimizer.step() after backward, for each
// element-wise optimizer, with bucket views, with no_sync() accumulation, a learning rate changed
// between steps and PowerSGD inside; and what register_comm_hook refuses.
#include <ddp/comm_hook.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/adadelta.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace test_overlap_step {

constexpr int64_t kGlobalBatch = 16;  // divides over 1, 2 and 4 ranks

using Net = ddp_test::TinyMlp;  // the same weights on every rank and in every copy

using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

template <typename Optimizer, typename Options>
Factory make(Options options) {
  return [options](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<Optimizer>(p, options);
  };
}

// Buckets of at most ~100 floats: the net's six parameters fall into several buckets.
ddp::DDPOptions small_buckets(bool views) {
  ddp::DDPOptions options;
  options.bucket_cap_mb = 400.0 / (1 << 20);
  options.first_bucket_mb = 400.0 / (1 << 20);
  options.reducer_at_one_rank = true;
  options.gradient_as_bucket_view = views;
  return options;
}

// Backward of this rank's rows of step `step`'s global batch through `model`.
void backward(ddp::DistributedDataParallel& model, int step) {
  torch::manual_seed(100 + step);
  const torch::Tensor x = torch::randn({kGlobalBatch, 6}), y = torch::randn({kGlobalBatch, 3});
  const int rank = ddp_test::group().rank();
  const int64_t share = kGlobalBatch / ddp_test::group().size();
  auto rows = [&](const torch::Tensor& t) { return t.slice(0, rank * share, (rank + 1) * share); };
  torch::mse_loss(model(rows(x)), rows(y)).backward();
}

// Trains two copies of the net for 5 steps, one stepped after backward and one inside it; with
// `accumulate`, each step is a no_sync() backward and a synchronised one. After step 2 both
// learning rates are halved, as a schedule would. Expects the parameters equal bit for bit.
// `inner` makes the hook both use (the overlapped one composed with the step).
void expect_overlap_equals_plain(
    const Factory& factory, const std::string& name, bool views, bool accumulate = false,
    const std::function<ddp::CommHook()>& inner = ddp::allreduce_hook) {
  SCOPED_TRACE(name + (views ? ", bucket views" : "") + (accumulate ? ", no_sync" : ""));
  Net plain_net, overlap_net;
  ddp::DistributedDataParallel plain(ddp_test::group(), plain_net, small_buckets(views));
  ddp::DistributedDataParallel overlap(ddp_test::group(), overlap_net, small_buckets(views));
  ASSERT_GE(overlap.bucket_layout().size(), 3u) << "the test needs several buckets";
  auto plain_opt = factory(plain_net->parameters());
  auto overlap_opt = factory(overlap_net->parameters());
  plain.register_comm_hook(inner());
  overlap.register_comm_hook(ddp::hook_then_optimizer(inner(), *overlap_opt));
  ASSERT_EQ(overlap.backward_steps_optimizer(), overlap_opt.get());
  EXPECT_EQ(plain.backward_steps_optimizer(), nullptr);
  for (int step = 0; step < 5; ++step) {
    if (step == 2) {
      for (auto* opt : {plain_opt.get(), overlap_opt.get()}) {
        for (auto& group : opt->param_groups())
          group.options().set_lr(group.options().get_lr() / 2);
      }
    }
    plain_opt->zero_grad(!views);
    overlap_opt->zero_grad(!views);
    if (accumulate) {
      auto guard = plain.no_sync();
      backward(plain, 50 + step);
    }
    if (accumulate) {
      auto guard = overlap.no_sync();
      const torch::Tensor before = overlap_net->a->weight.clone();
      backward(overlap, 50 + step);
      EXPECT_TRUE(overlap_net->a->weight.equal(before)) << "a no_sync() backward stepped";
    }
    backward(plain, step);
    plain_opt->step();
    const torch::Tensor before = overlap_net->a->weight.clone();
    backward(overlap, step);  // steps
    EXPECT_FALSE(overlap_net->a->weight.equal(before)) << "backward did not step, step " << step;
  }
  const auto expected = plain_net->parameters(), got = overlap_net->parameters();
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(got[i].equal(expected[i])) << "parameter " << i << " differs: max |diff| "
                                           << (got[i] - expected[i]).abs().max().item<double>();
    EXPECT_TRUE(ddp_test::identical_on_all_ranks(got[i])) << "parameter " << i;
  }
}

TEST(OverlapOptimizerStep, EachElementwiseOptimizerEqualsThePlainStep) {
  using namespace torch::optim;
  expect_overlap_equals_plain(
      make<SGD>(SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3)), "SGD", false);
  expect_overlap_equals_plain(make<Adam>(AdamOptions(0.01).amsgrad(true)), "Adam", false);
  expect_overlap_equals_plain(make<AdamW>(AdamWOptions(0.01)), "AdamW", false);
  expect_overlap_equals_plain(make<Adagrad>(AdagradOptions(0.1)), "Adagrad", false);
  expect_overlap_equals_plain(make<RMSprop>(RMSpropOptions(0.01).momentum(0.5).centered(true)),
                              "RMSprop", false);
}

TEST(OverlapOptimizerStep, AnyPerParameterOptimizerEqualsThePlainStep) {
  // The kit's Adadelta (the seed's optimizer): composing the hook declares the contract.
  expect_overlap_equals_plain(make<ddp::Adadelta>(ddp::AdadeltaOptions(1.0)), "ddp::Adadelta",
                              false);
}

TEST(OverlapOptimizerStep, PowerSgdInsideEqualsThePlainStep) {
  // Compressed from the third step on; the state is the inner hook's, one per wrapper.
  auto powersgd = [] {
    auto state = std::make_shared<ddp::PowerSGDState>();
    state->start_powerSGD_iter = 2;
    return ddp::powersgd_hook(state);
  };
  expect_overlap_equals_plain(make<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)),
                              "SGD, PowerSGD", false, false, powersgd);
}

TEST(OverlapOptimizerStep, EqualsThePlainStepWithBucketViewsAndNoSync) {
  using namespace torch::optim;
  expect_overlap_equals_plain(make<SGD>(SGDOptions(0.1).momentum(0.9)), "SGD", true);
  expect_overlap_equals_plain(make<Adam>(AdamOptions(0.01)), "Adam", true);
  expect_overlap_equals_plain(make<SGD>(SGDOptions(0.1).momentum(0.9)), "SGD", false, true);
  expect_overlap_equals_plain(make<Adam>(AdamOptions(0.01)), "Adam", true, true);
}

TEST(OverlapOptimizerStep, TwoParamGroupsStepWithTheirOwnOptions) {
  Net plain_net, overlap_net;
  ddp::DistributedDataParallel plain(ddp_test::group(), plain_net, small_buckets(false));
  ddp::DistributedDataParallel overlap(ddp_test::group(), overlap_net, small_buckets(false));
  auto groups = [](Net& net) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(net->a->parameters(), std::make_unique<torch::optim::SGDOptions>(0.3));
    std::vector<torch::Tensor> rest = net->b->parameters();
    for (const auto& p : net->c->parameters()) rest.push_back(p);
    g.emplace_back(rest, std::make_unique<torch::optim::SGDOptions>(0.01));
    return g;
  };
  torch::optim::SGD plain_opt(groups(plain_net), torch::optim::SGDOptions(0.1));
  torch::optim::SGD overlap_opt(groups(overlap_net), torch::optim::SGDOptions(0.1));
  overlap.register_comm_hook(ddp::hook_then_optimizer(ddp::allreduce_hook(), overlap_opt));
  for (int step = 0; step < 3; ++step) {
    plain_opt.zero_grad();
    overlap_opt.zero_grad();
    backward(plain, step);
    plain_opt.step();
    backward(overlap, step);
  }
  EXPECT_EQ(overlap_opt.param_groups()[0].params().size(), 2u) << "the groups were not given back";
  EXPECT_EQ(overlap_opt.param_groups()[1].params().size(), 4u);
  const auto expected = plain_net->parameters(), got = overlap_net->parameters();
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(got[i].equal(expected[i])) << i;
}

TEST(OverlapOptimizerStep, OneRankWithoutAReducerDoesNotStepInBackward) {
  if (ddp_test::group().size() != 1) GTEST_SKIP() << "one rank only";
  Net net;
  ddp::DistributedDataParallel model(ddp_test::group(), net);  // no Reducer at one rank
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  model.register_comm_hook(ddp::hook_then_optimizer(ddp::allreduce_hook(), optimizer));
  EXPECT_EQ(model.backward_steps_optimizer(), nullptr);
  const torch::Tensor before = net->a->weight.clone();
  backward(model, 0);
  EXPECT_TRUE(net->a->weight.equal(before)) << "backward stepped without a Reducer";
}

TEST(OverlapOptimizerStep, RefusesWhatNeedsMoreThanOneBucket) {
  Net net, other;
  ddp::DDPOptions options = small_buckets(false);
  ddp::DistributedDataParallel model(ddp_test::group(), net, options);
  torch::optim::SGD foreign(other->parameters(), torch::optim::SGDOptions(0.1));
  try {
    model.register_comm_hook(ddp::hook_then_optimizer(ddp::allreduce_hook(), foreign));
    ADD_FAILURE() << "an optimizer of another module's parameters was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is not a parameter of the wrapped module"),
              std::string::npos)
        << e.what();
  }
  options.find_unused_parameters = true;
  ddp::DistributedDataParallel unused(ddp_test::group(), other, options);
  torch::optim::SGD sgd(other->parameters(), torch::optim::SGDOptions(0.1));
  try {
    unused.register_comm_hook(ddp::hook_then_optimizer(ddp::allreduce_hook(), sgd));
    ADD_FAILURE() << "find_unused_parameters was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos) << e.what();
  }
  EXPECT_EQ(unused.backward_steps_optimizer(), nullptr);
  torch::optim::SGD mine(net->parameters(), torch::optim::SGDOptions(0.1));
  const ddp::CommHook twice = ddp::hook_then_optimizer(ddp::allreduce_hook(), mine);
  EXPECT_THROW(ddp::hook_then_optimizer(twice, mine), std::invalid_argument);
  // The composition keeps the inner hook's description and state (snapshots resume either way).
  auto state = std::make_shared<ddp::PowerSGDState>();
  const ddp::CommHook inner = ddp::powersgd_hook(state);
  const ddp::CommHook composed = ddp::hook_then_optimizer(inner, mine);
  EXPECT_EQ(composed.description(), inner.description());
  EXPECT_EQ(composed.state(), inner.state());
  EXPECT_EQ(composed.steps_optimizer(), &mine);
  EXPECT_EQ(inner.steps_optimizer(), nullptr);
}

}  // namespace test_overlap_step

// Tied weights (issue 60, found by the GPT port): the literal C++ of Python's weight tie,
// `lm_head->weight = wte->weight`, ties the member that forward computes with, not the
// registered parameter that the optimizer steps, the ranks average and a snapshot saves. The
// wrapper refuses it at construction for LibTorch's layers, at every world size; a user's own
// module with a reassigned member is named after the first backward at one rank (no Reducer) and
// after every backward at more, the message naming the likely cause and register_parameter before
// find_unused_parameters. The tie through the one registered tensor trains at any world size.
#include <ddp/distributed_data_parallel.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

namespace test_tied_weights {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

constexpr int64_t kVocab = 10, kWidth = 4;

// A GPT's embedding and head, tied the way public LibTorch code writes it.
struct LiteralTie : torch::nn::Module {
  LiteralTie()
      : wte(register_module("wte", torch::nn::Embedding(kVocab, kWidth))),
        lm_head(register_module(
            "lm_head", torch::nn::Linear(torch::nn::LinearOptions(kWidth, kVocab).bias(false)))) {
    lm_head->weight = wte->weight;
  }
  torch::Tensor forward(torch::Tensor idx) { return lm_head(wte(idx)); }
  torch::nn::Embedding wte;
  torch::nn::Linear lm_head;
};

// The same with a head of the user's own, whose member the wrapper cannot see.
struct OwnHead : torch::nn::Module {
  OwnHead() : weight(register_parameter("weight", torch::randn({kVocab, kWidth}))) {}
  torch::Tensor forward(torch::Tensor x) { return torch::matmul(x, weight.t()); }
  torch::Tensor weight;
};
struct OwnTie : torch::nn::Module {
  OwnTie()
      : wte(register_module("wte", torch::nn::Embedding(kVocab, kWidth))),
        head(register_module("head", std::make_shared<OwnHead>())) {
    head->weight = wte->weight;
  }
  torch::Tensor forward(torch::Tensor idx) { return head->forward(wte(idx)); }
  torch::nn::Embedding wte;
  std::shared_ptr<OwnHead> head;
};

// The tie through the one registered tensor: the head computes with wte's weight.
struct FunctionalTie : torch::nn::Module {
  FunctionalTie() : wte(register_module("wte", torch::nn::Embedding(kVocab, kWidth))) {}
  torch::Tensor forward(torch::Tensor idx) {
    return torch::nn::functional::linear(wte(idx), wte->weight);
  }
  torch::nn::Embedding wte;
};

torch::Tensor tokens() { return torch::arange(6, torch::kLong).remainder(kVocab).reshape({2, 3}); }

std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The premise: the registered lm_head.weight is not what forward uses, so a step leaves it as it
// was, and it is what parameters() and a saved file hold.
TEST(TiedWeights, TheLiteralTieLeavesTheRegisteredParameterUntrained) {
  torch::manual_seed(1);
  auto net = std::make_shared<LiteralTie>();
  const torch::Tensor registered = net->named_parameters()["lm_head.weight"];
  EXPECT_FALSE(registered.is_same(net->wte->weight));
  const torch::Tensor before = registered.detach().clone();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  net->forward(tokens()).pow(2).mean().backward();
  optimizer.step();
  EXPECT_FALSE(registered.grad().defined());
  EXPECT_TRUE(torch::equal(registered, before));
}

TEST(TiedWeights, TheLiteralTieIsRefusedAtConstructionNamingTheParameterAndTheFix) {
  torch::manual_seed(1);
  auto net = std::make_shared<LiteralTie>();
  const std::string refused = message_of([&] { ddp::DistributedDataParallel model(pg(), net); });
  EXPECT_EQ(refused.rfind("DistributedDataParallel: 'lm_head.weight' (torch::nn::Linear's member "
                          "weight) is not the registered parameter of that name: the member was "
                          "reassigned after register_parameter registered it",
                          0),
            0u)
      << refused;
  EXPECT_NE(refused.find("torch::nn::functional::linear(x, wte->weight)"), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("docs/porting.md"), std::string::npos) << refused;
}

TEST(TiedWeights, AReassignedMemberOfAUsersModuleIsNamedAfterTheFirstBackward) {
  torch::manual_seed(1);
  auto net = std::make_shared<OwnTie>();
  ddp::DistributedDataParallel model(pg(), net);  // OwnHead is not a layer the wrapper knows
  const std::string refused = message_of([&] { model.forward(tokens()).pow(2).mean().backward(); });
  std::string ranks;
  for (int r = 0; r < rt().world_size(); ++r) ranks += (r ? "," : "") + std::to_string(r);
  EXPECT_NE(refused.find("1 parameter(s) got no gradient in this backward pass: 'head.weight' "
                         "(rank " +
                         ranks + ")"),
            std::string::npos)
      << refused;
  const size_t cause = refused.find(
      "a module member reassigned after register_parameter "
      "registered it (`lm_head->weight = wte->weight`");
  EXPECT_NE(cause, std::string::npos) << refused;
  EXPECT_LT(cause, refused.find("find_unused_parameters")) << refused;
  // With find_unused_parameters the one-rank path checks nothing, as asked.
  if (rt().world_size() == 1) {
    torch::manual_seed(1);
    auto declared = std::make_shared<OwnTie>();
    ddp::DDPOptions options;
    options.find_unused_parameters = true;
    ddp::DistributedDataParallel unchecked(pg(), declared, options);
    EXPECT_EQ(message_of([&] { unchecked.forward(tokens()).pow(2).mean().backward(); }), "");
  }
}

// A parameter unused by one rank only is not a reassigned member: the message does not say so.
TEST(TiedWeights, AParameterSomeRanksUseIsNotBlamedOnATie) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  torch::manual_seed(1);
  auto net = std::make_shared<FunctionalTie>();
  auto extra = std::make_shared<torch::nn::LinearImpl>(kWidth, kVocab);
  net->register_module("extra", extra);
  ddp::DistributedDataParallel model(pg(), std::shared_ptr<torch::nn::Module>(net));
  const std::string refused = message_of([&] {
    model.prepare_forward();
    torch::Tensor out = net->forward(tokens());
    if (rt().rank() == 0) out = out + extra->forward(net->wte(tokens()));
    out.pow(2).mean().backward();
  });
  EXPECT_NE(refused.find("got no gradient"), std::string::npos) << refused;
  EXPECT_EQ(refused.find("reassigned"), std::string::npos) << refused;
}

TEST(TiedWeights, TheTieThroughTheRegisteredTensorTrainsAtAnyWorldSize) {
  torch::manual_seed(1);
  auto net = std::make_shared<FunctionalTie>();
  ddp::DistributedDataParallel model(pg(), net);
  ASSERT_EQ(net->parameters().size(), 1u);  // one tensor, stepped once
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor before = net->wte->weight.detach().clone();
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    torch::manual_seed(static_cast<uint64_t>(10 * step + rt().rank()));
    const torch::Tensor idx = torch::randint(0, kVocab, {2, 3});
    model.forward(idx).pow(2).mean().backward();
    optimizer.step();
  }
  EXPECT_FALSE(torch::equal(net->wte->weight, before));
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(net->wte->weight.detach()));
}

}  // namespace test_tied_weights

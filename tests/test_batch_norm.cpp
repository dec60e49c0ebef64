#include <ddp/sync_batch_norm.h>
#include "comm/mpi_communicator.h"
#include "runtime/runtime_internals.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

namespace {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

// Forwards to an MpiCommunicator of its own and counts the all-reduces.
class CountingCommunicator final : public ddp::Communicator {
 public:
  CountingCommunicator() : mpi_(ddp::detail::RuntimeInternals::comm(rt())) {}
  std::string backend() const override { return mpi_.backend(); }
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  std::unique_ptr<ddp::Work> all_reduce_async(const torch::Tensor& tensor,
                                              ddp::ReduceOp op) override {
    ++all_reduces;
    return mpi_.all_reduce_async(tensor, op);
  }
  void broadcast(const torch::Tensor& tensor, int root) override { mpi_.broadcast(tensor, root); }
  torch::Tensor all_gather(const torch::Tensor& tensor) override { return mpi_.all_gather(tensor); }
  void barrier() override { mpi_.barrier(); }

  int all_reduces = 0;

 private:
  ddp::MpiCommunicator mpi_;
};

torch::nn::BatchNormOptions options(int64_t channels, c10::optional<double> momentum = 0.1,
                                    bool affine = true, bool track_running_stats = true) {
  return torch::nn::BatchNormOptions(channels).momentum(momentum).affine(affine).track_running_stats(
      track_running_stats);
}

// Gives both modules the same non-trivial weight and bias.
template <typename A, typename B>
void set_same_affine(A& a, B& b, int64_t channels, torch::Dtype dtype) {
  if (!a->options.affine()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor w = torch::rand({channels}, torch::kDouble) + 0.5;
  const torch::Tensor bias = torch::randn({channels}, torch::kDouble);
  a->weight.copy_(w.to(dtype));
  b->weight.copy_(w.to(dtype));
  a->bias.copy_(bias.to(dtype));
  b->bias.copy_(bias.to(dtype));
}

std::vector<std::string> keys(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  return dict.keys();
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, tolerance, tolerance))
      << what << ": max diff " << (got - want).abs().max().item<double>() << " on rank " << rt().rank();
}

// Local mode is torch::nn::BatchNorm2d, bit for bit: the same kernel on the same state.
TEST(BatchNorm2d, LocalModeIsTorchBatchNorm2d) {
  const int64_t c = 3;
  for (const auto& opts : {options(c), options(c, c10::nullopt), options(c, 0.3, /*affine=*/false),
                           options(c, 0.1, true, /*track_running_stats=*/false)}) {
    const std::string name = c10::str(torch::nn::BatchNorm2d(opts));
    torch::manual_seed(5);
    torch::nn::BatchNorm2d reference(opts);
    ddp::BatchNorm2d mine(opts);
    EXPECT_EQ(keys(mine->named_parameters()), keys(reference->named_parameters())) << name;
    EXPECT_EQ(keys(mine->named_buffers()), keys(reference->named_buffers())) << name;
    set_same_affine(mine, reference, c, torch::kFloat);
    for (int step = 0; step < 3; ++step) {
      const torch::Tensor x = torch::randn({4, c, 5, 6}) * 3 + 1;
      const torch::Tensor r = torch::randn({4, c, 5, 6});
      torch::Tensor x_mine = x.clone().requires_grad_(), x_ref = x.clone().requires_grad_();
      const torch::Tensor out_mine = mine(x_mine), out_ref = reference(x_ref);
      (out_mine * r).sum().backward();
      (out_ref * r).sum().backward();
      EXPECT_TRUE(torch::equal(out_mine, out_ref)) << name << ", step " << step;
      EXPECT_TRUE(torch::equal(x_mine.grad(), x_ref.grad())) << name << ", step " << step;
      const auto p_mine = mine->parameters(), p_ref = reference->parameters();
      ASSERT_EQ(p_mine.size(), p_ref.size()) << name;
      for (size_t i = 0; i < p_mine.size(); ++i) {
        EXPECT_TRUE(torch::equal(p_mine[i].grad(), p_ref[i].grad())) << name << ", parameter " << i;
      }
      const auto b_mine = mine->buffers(), b_ref = reference->buffers();
      ASSERT_EQ(b_mine.size(), b_ref.size()) << name;
      for (size_t i = 0; i < b_mine.size(); ++i) {
        EXPECT_TRUE(torch::equal(b_mine[i], b_ref[i])) << name << ", buffer " << i << ", step " << step;
      }
    }
    mine->eval();
    reference->eval();
    const torch::Tensor x = torch::randn({2, c, 4, 4});
    EXPECT_TRUE(torch::equal(mine(x), reference(x))) << name << ", eval";
  }
  EXPECT_THROW(ddp::BatchNorm2d(3)(torch::randn({4, 3, 5})), std::invalid_argument);
}

TEST(BatchNorm2d, StateLoadsIntoTorchBatchNorm2dAndBack) {
  torch::manual_seed(6);
  const int64_t c = 4;
  torch::nn::BatchNorm2d reference(c);
  set_same_affine(reference, reference, c, torch::kFloat);
  for (int step = 0; step < 2; ++step) reference(torch::randn({3, c, 2, 2}) + step);

  std::stringstream from_torch;
  torch::save(reference, from_torch);
  ddp::BatchNorm2d mine(c);
  torch::load(mine, from_torch);
  EXPECT_EQ(mine->num_batches_tracked.item<int64_t>(), 2);
  for (const auto& item : reference->named_parameters()) {
    EXPECT_TRUE(torch::equal(mine->named_parameters()[item.key()], item.value())) << item.key();
  }
  for (const auto& item : reference->named_buffers()) {
    EXPECT_TRUE(torch::equal(mine->named_buffers()[item.key()], item.value())) << item.key();
  }

  mine(torch::randn({3, c, 2, 2}));
  std::stringstream from_ddp;
  torch::save(mine, from_ddp);
  torch::nn::BatchNorm2d back(c);
  torch::load(back, from_ddp);
  EXPECT_EQ(back->num_batches_tracked.item<int64_t>(), 3);
  for (const auto& item : mine->named_buffers()) {
    EXPECT_TRUE(torch::equal(back->named_buffers()[item.key()], item.value())) << item.key();
  }
}

struct SyncCase {
  const char* name;
  torch::Dtype dtype;
  double tolerance;
  torch::nn::BatchNormOptions options;
};

// Rank r holds samples [offset(r), offset(r) + batch(r)) of the global batch: the counts differ
// across ranks, and at 4 ranks rank 2's batch is empty.
int64_t batch(int r) { return r == 2 ? 0 : 2 + r; }
int64_t offset(int r) {
  int64_t o = 0;
  for (int q = 0; q < r; ++q) o += batch(q);
  return o;
}

// N ranks on their slices of a batch compute what torch::nn::BatchNorm2d computes on the whole
// batch: outputs, input gradients, weight and bias gradients summed over the ranks, running
// statistics; then eval mode, without communicating.
TEST(BatchNorm2d, SynchronisedEqualsOneProcessOnTheGlobalBatch) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t c = 4, total = offset(w), steps = 3;
  const std::vector<SyncCase> cases = {
      {"float64", torch::kDouble, 1e-12, options(c)},
      {"float64, cumulative average", torch::kDouble, 1e-12, options(c, c10::nullopt)},
      {"float64, no affine", torch::kDouble, 1e-12, options(c, 0.2, /*affine=*/false)},
      {"float32", torch::kFloat, 1e-5, options(c)},
  };
  for (const SyncCase& sc : cases) {
    torch::manual_seed(7);
    torch::nn::BatchNorm2d reference(sc.options);
    ddp::BatchNorm2d mine(sc.options);
    reference->to(sc.dtype);
    mine->to(sc.dtype);
    set_same_affine(mine, reference, c, sc.dtype);
    auto comm = std::make_shared<CountingCommunicator>();
    mine->set_sync_communicator(comm);
    const torch::Tensor x = (torch::randn({steps, total, c, 5, 3}, torch::kDouble) * 2 + 3).to(sc.dtype);
    const torch::Tensor weights = torch::randn({total, c, 5, 3}, torch::kDouble).to(sc.dtype);
    const torch::Tensor my_weights = weights.slice(0, offset(r), offset(r) + batch(r));
    for (int64_t s = 0; s < steps; ++s) {
      const std::string where = std::string(sc.name) + ", step " + std::to_string(s);
      for (const auto& p : mine->parameters()) p.mutable_grad().reset();
      for (const auto& p : reference->parameters()) p.mutable_grad().reset();
      torch::Tensor x_mine = x[s].slice(0, offset(r), offset(r) + batch(r)).clone().requires_grad_();
      torch::Tensor x_ref = x[s].clone().requires_grad_();
      const torch::Tensor out_mine = mine(x_mine), out_ref = reference(x_ref);
      (out_mine * my_weights).sum().backward();
      (out_ref * weights).sum().backward();
      EXPECT_EQ(comm->all_reduces, 2 * (s + 1)) << where << ": one all-reduce forward, one backward";

      const torch::Tensor slice_ref = out_ref.slice(0, offset(r), offset(r) + batch(r));
      expect_close(out_mine, slice_ref, sc.tolerance, where + ": output");
      expect_close(x_mine.grad(), x_ref.grad().slice(0, offset(r), offset(r) + batch(r)), sc.tolerance,
                   where + ": input gradient");
      if (sc.options.affine()) {
        for (const char* p : {"weight", "bias"}) {
          const torch::Tensor summed = mine->named_parameters()[p].grad().clone();
          pg().cpu().all_reduce(summed);
          expect_close(summed, reference->named_parameters()[p].grad(), sc.tolerance,
                       where + ": " + p + " gradient summed over ranks");
        }
      }
      expect_close(mine->running_mean, reference->running_mean, sc.tolerance, where + ": running_mean");
      expect_close(mine->running_var, reference->running_var, sc.tolerance, where + ": running_var");
      EXPECT_EQ(mine->num_batches_tracked.item<int64_t>(), s + 1) << where;
    }
    mine->eval();
    reference->eval();
    const torch::Tensor x_eval = torch::randn({2, c, 3, 3}, torch::kDouble).to(sc.dtype);
    expect_close(mine(x_eval), reference(x_eval), sc.tolerance, std::string(sc.name) + ": eval");
    EXPECT_EQ(comm->all_reduces, 2 * steps) << sc.name << ": eval communicated";
  }
}

// With an input that needs no gradient (the first layer), backward has nothing to all-reduce;
// the weight and bias gradients are still right.
TEST(BatchNorm2d, SynchronisedBackwardSkipsTheAllReduceWithoutAnInputGradient) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t c = 3, total = offset(w);
  torch::manual_seed(8);
  torch::nn::BatchNorm2d reference(c);
  ddp::BatchNorm2d mine(c);
  reference->to(torch::kDouble);
  mine->to(torch::kDouble);
  set_same_affine(mine, reference, c, torch::kDouble);
  auto comm = std::make_shared<CountingCommunicator>();
  mine->set_sync_communicator(comm);
  const torch::Tensor x = torch::randn({total, c, 4, 4}, torch::kDouble);
  const torch::Tensor weights = torch::randn({total, c, 4, 4}, torch::kDouble);
  const auto mine_slice = [&](const torch::Tensor& t) { return t.slice(0, offset(r), offset(r) + batch(r)); };
  (mine(mine_slice(x)) * mine_slice(weights)).sum().backward();
  (reference(x) * weights).sum().backward();
  EXPECT_EQ(comm->all_reduces, 1);
  for (const char* p : {"weight", "bias"}) {
    const torch::Tensor summed = mine->named_parameters()[p].grad().clone();
    pg().cpu().all_reduce(summed);
    expect_close(summed, reference->named_parameters()[p].grad(), 1e-12, std::string(p) + " gradient");
  }
}

// One value per channel over all ranks cannot be normalised: every rank throws (none is left
// waiting in a collective), including those with an empty batch.
TEST(BatchNorm2d, SynchronisedRejectsOneValuePerChannelOnEveryRank) {
  ddp::BatchNorm2d bn(2);
  bn->set_sync_communicator(std::make_shared<ddp::MpiCommunicator>(ddp::detail::RuntimeInternals::comm(rt())));
  const torch::Tensor x = torch::randn({rt().rank() == 0 ? 1 : 0, 2, 1, 1});
  try {
    bn(x);
    FAIL() << "no exception on rank " << rt().rank();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel over all ranks"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 0);
}

struct Block : torch::nn::Module {
  Block()
      : conv(register_module("conv", torch::nn::Conv2d(3, 4, 1))),
        norm(register_module("norm", ddp::BatchNorm2d(4))),
        stack(register_module("stack", torch::nn::ModuleList(ddp::BatchNorm2d(4), torch::nn::ReLU(),
                                                             torch::nn::Sequential(torch::nn::Conv2d(4, 4, 1),
                                                                                   ddp::BatchNorm2d(4))))) {}
  torch::nn::Conv2d conv;
  ddp::BatchNorm2d norm;
  torch::nn::ModuleList stack;
};

TEST(BatchNorm2d, ConvertSyncBatchnormReachesNestedLayers) {
  auto comm = std::make_shared<ddp::MpiCommunicator>(ddp::detail::RuntimeInternals::comm(rt()));
  Block block;  // on the stack: the root is not reached through shared_from_this()
  EXPECT_FALSE(block.norm->synchronised());
  EXPECT_EQ(ddp::convert_sync_batchnorm(block, comm), 3);
  EXPECT_TRUE(block.norm->synchronised());
  EXPECT_TRUE(block.stack[0]->as<ddp::BatchNorm2dImpl>()->synchronised());
  EXPECT_TRUE(block.stack[2]->as<torch::nn::SequentialImpl>()->ptr(1)->as<ddp::BatchNorm2dImpl>()->synchronised());

  ddp::BatchNorm2d alone(2);
  EXPECT_EQ(ddp::convert_sync_batchnorm(*alone, comm), 1);
  EXPECT_TRUE(alone->synchronised());
  EXPECT_THROW(ddp::convert_sync_batchnorm(*alone, nullptr), std::invalid_argument);
}

TEST(BatchNorm2d, ConvertSyncBatchnormNamesTorchBatchNormLayers) {
  torch::nn::ModuleList net(ddp::BatchNorm2d(3), torch::nn::BatchNorm2d(3),
                            torch::nn::Sequential(torch::nn::Flatten(), torch::nn::BatchNorm1d(48)));
  try {
    ddp::convert_sync_batchnorm(*net, std::make_shared<ddp::MpiCommunicator>(ddp::detail::RuntimeInternals::comm(rt())));
    FAIL() << "torch::nn::BatchNorm2d accepted";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("(1, 2.1)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ddp::BatchNorm2d"), std::string::npos) << msg;
  }
  EXPECT_FALSE(net[0]->as<ddp::BatchNorm2dImpl>()->synchronised()) << "converted before refusing";
}

}  // namespace

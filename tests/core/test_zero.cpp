// ZeroRedundancyOptimizer (ZeRO-1) at the number of ranks the binary runs with (ctest: 1, 2, 4):
// equal within 1e-6 to the unsharded optimizer stepped by one process on the same global
// batches (SGD with momentum and Adam; over MPI, the TCP ring, and beside DDP with noop_hook), its
// consolidated state loads into an unsharded optimizer and at half the ranks and continues
// equal, the Checkpointer's snapshots resume it bit for bit, and each rank keeps the state of its
// shard only.
#include <ddp/comm_hook.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/checkpointer.h>
#include <ddp/zero_redundancy_optimizer.h>
#include "comm/mpi/mpi_communicator.h"
#include "comm/ring/socket_ring.h"
#include "runtime/runtime_internals.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace test_zero {

constexpr int64_t kGlobalBatch = 16;  // divides over 1, 2 and 4 ranks
constexpr double kTolerance = 1e-6;

MPI_Comm world() { return ddp::detail::RuntimeInternals::comm(ddp_test::runtime()); }

using Net = ddp_test::TinyMlp;  // the same weights on every rank and in every copy

// Step `step`'s global batch, the same on every rank.
std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({kGlobalBatch, 6}), torch::randn({kGlobalBatch, 3})};
}

// Mean squared error of `net` on this rank's rows of the global batch: rows [rank B/n, ...).
void backward_on_share(Net& net, int step, int rank, int ranks) {
  const auto [x, y] = batch(step);
  const int64_t share = kGlobalBatch / ranks;
  const auto rows = [&](const torch::Tensor& t) {
    return t.slice(0, rank * share, (rank + 1) * share);
  };
  torch::mse_loss(net->forward(rows(x)), rows(y)).backward();
}

using Factory = ddp::ZeroRedundancyOptimizer::Factory;

Factory sgd() {
  return [](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  };
}
Factory adam() {
  return [](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
  };
}

// One process, the unsharded optimizer, the whole global batch, steps [first, last).
void reference_steps(Net& net, torch::optim::Optimizer& optimizer, int first, int last) {
  for (int s = first; s < last; ++s) {
    optimizer.zero_grad();
    backward_on_share(net, s, 0, 1);
    optimizer.step();
  }
}

void zero_steps(Net& net, ddp::ZeroRedundancyOptimizer& optimizer, ddp::Communicator& comm,
                int first, int last) {
  for (int s = first; s < last; ++s) {
    optimizer.zero_grad();
    backward_on_share(net, s, comm.rank(), comm.size());
    optimizer.step();
  }
}

double max_difference(const Net& a, const Net& b) {
  double worst = 0;
  const auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

void copy_parameters(const Net& from, Net& to) {
  torch::NoGradGuard no_grad;
  const auto pf = from->parameters(), pt = to->parameters();
  for (size_t i = 0; i < pf.size(); ++i) pt[i].copy_(pf[i]);
}

void expect_equal_to_unsharded(ddp::Communicator& comm, const Factory& factory, const char* what) {
  constexpr int kSteps = 5;
  Net reference;
  auto unsharded = factory(reference->parameters());
  reference_steps(reference, *unsharded, 0, kSteps);

  Net net;
  ddp::ZeroRedundancyOptimizer optimizer(net->parameters(), comm, factory);
  zero_steps(net, optimizer, comm, 0, kSteps);
  EXPECT_LE(max_difference(net, reference), kTolerance) << what << " on " << comm.backend();
  EXPECT_GT(max_difference(net, Net()), 1e-3) << what << ": the steps changed nothing";
  EXPECT_TRUE(
      ddp_test::identical_on_all_ranks(torch::cat({net->a->weight.view(-1), net->c->bias})));
}

TEST(ZeroRedundancyOptimizer, SgdWithMomentumEqualsUnshardedOverMpi) {
  expect_equal_to_unsharded(ddp_test::group().cpu(), sgd(), "SGD");
}

TEST(ZeroRedundancyOptimizer, AdamEqualsUnshardedOverMpi) {
  expect_equal_to_unsharded(ddp_test::group().cpu(), adam(), "Adam");
}

TEST(ZeroRedundancyOptimizer, AdamEqualsUnshardedOverTheSocketRing) {
  ddp::SocketRing ring(world(), ddp::SocketRingOptions{});
  expect_equal_to_unsharded(ring, adam(), "Adam");
}

// Beside DDP: noop_hook leaves each rank its gradients, ZeRO's step reduce-scatters them once.
TEST(ZeroRedundancyOptimizer, BesideDdpWithTheNoopHookEqualsUnsharded) {
  constexpr int kSteps = 4;
  Net reference;
  auto unsharded = adam()(reference->parameters());
  reference_steps(reference, *unsharded, 0, kSteps);

  Net net;
  ddp::DDPOptions at_one_rank_too;
  at_one_rank_too.reducer_at_one_rank = true;  // the hook runs at one rank too
  ddp::DistributedDataParallel model(ddp_test::group(), net.ptr(), at_one_rank_too);
  model.register_comm_hook(ddp::noop_hook());
  EXPECT_EQ(model.comm_hook_description(), "noop");
  ddp::ZeroRedundancyOptimizer optimizer(net->parameters(), ddp_test::group().cpu(), adam());
  const int rank = ddp_test::group().rank(), ranks = ddp_test::group().size();
  for (int s = 0; s < kSteps; ++s) {
    optimizer.zero_grad();
    const auto [x, y] = batch(s);
    const int64_t share = kGlobalBatch / ranks;
    torch::mse_loss(model.forward(x.slice(0, rank * share, (rank + 1) * share)),
                    y.slice(0, rank * share, (rank + 1) * share))
        .backward();
    if (s == 0 && ranks > 1) {  // backward left this rank's own gradients: they differ by rank
      EXPECT_FALSE(ddp_test::identical_on_all_ranks(net->a->weight.grad()));
    }
    optimizer.step();
  }
  EXPECT_LE(max_difference(net, reference), kTolerance);
}

TEST(ZeroRedundancyOptimizer, ConsolidatedStateLoadsUnshardedAndAtHalfTheRanks) {
  constexpr int kBefore = 3, kAfter = 6;
  ddp::Communicator& comm = ddp_test::group().cpu();
  const int w = comm.size(), r = comm.rank();
  Net reference;
  auto unsharded = adam()(reference->parameters());
  reference_steps(reference, *unsharded, 0, kAfter);

  Net net;
  ddp::ZeroRedundancyOptimizer optimizer(net->parameters(), comm, adam());
  zero_steps(net, optimizer, comm, 0, kBefore);
  std::string bytes;
  {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);  // collective: rank 0 writes the consolidated state
    if (r == 0) {
      std::ostringstream out;
      archive.save_to(out);
      bytes = out.str();
    }
  }
  bytes = ddp::all_gather_strings(comm, bytes)[0];
  const auto load = [&](torch::optim::Optimizer& into) {
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    into.load(archive);
  };

  {  // an unsharded optimizer in one process continues as the reference did
    Net alone;
    copy_parameters(net, alone);
    auto plain = adam()(alone->parameters());
    load(*plain);
    reference_steps(alone, *plain, kBefore, kAfter);
    EXPECT_LE(max_difference(alone, reference), kTolerance);
  }
  {  // ZeRO over half the ranks ({0, 1} and {2, 3} at 4; each rank alone at 2 and 1)
    const int half = std::max(1, w / 2);
    MPI_Comm split = MPI_COMM_NULL;
    MPI_Comm_split(world(), r / half, r, &split);
    {
      ddp::MpiCommunicator smaller(split);
      Net resumed;
      copy_parameters(net, resumed);
      ddp::ZeroRedundancyOptimizer sharded(resumed->parameters(), smaller, adam());
      load(sharded);
      zero_steps(resumed, sharded, smaller, kBefore, kAfter);
      EXPECT_LE(max_difference(resumed, reference), kTolerance)
          << "at " << smaller.size() << " ranks";
    }
    MPI_Comm_free(&split);
  }
  {  // and the original optimizer continues too
    zero_steps(net, optimizer, comm, kBefore, kAfter);
    EXPECT_LE(max_difference(net, reference), kTolerance);
  }
}

torch::Tensor flat(const Net& net) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : net->parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

// A snapshot's save() gathers the shards to rank 0 on every rank; resume() loads the
// consolidated state on every rank, which keeps its shard: the run continues bit for bit.
TEST(ZeroRedundancyOptimizer, CheckpointerSnapshotsResumeBitIdentical) {
  ddp::ProcessGroup& group = ddp_test::group();
  ddp::CheckpointerOptions options;
  options.dir = ddp::all_gather_strings(
      group.cpu(), group.is_main() ? ddp_test::make_temp_dir("zero_resume") : "")[0];
  options.every_steps = 3;
  Net net;
  ddp::ZeroRedundancyOptimizer optimizer(net->parameters(), group.cpu(), adam());
  ddp::Checkpointer checkpointer(group, *net, optimizer, options);
  for (int step = 0; step < 8; ++step) {
    checkpointer.at_boundary(false, {2, step, step}, [] { return ddp::RankState{}; });
    zero_steps(net, optimizer, group.cpu(), step, step + 1);
  }
  const torch::Tensor final_weights = flat(net);

  Net again;
  ddp::ZeroRedundancyOptimizer again_optimizer(again->parameters(), group.cpu(), adam());
  ddp::CheckpointerOptions resume = options;
  resume.resume = "latest";
  ddp::Checkpointer resumed(group, *again, again_optimizer, resume);
  const ddp::ResumePoint start = resumed.resume();
  ASSERT_EQ(start.position.step, 6);
  EXPECT_FALSE(torch::equal(flat(again), final_weights));
  zero_steps(again, again_optimizer, group.cpu(), 6, 8);
  EXPECT_TRUE(torch::equal(flat(again), final_weights));
}

// Eight 16x16 layers: 2176 elements that split evenly over 1, 2 and 4 ranks.
TEST(ZeroRedundancyOptimizer, EachRankKeepsAboutOneNthOfTheState) {
  ddp::Communicator& comm = ddp_test::group().cpu();
  const int w = comm.size();
  torch::manual_seed(3);
  torch::nn::Sequential net;
  for (int i = 0; i < 8; ++i) net->push_back(torch::nn::Linear(16, 16));
  int64_t total = 0;
  for (const auto& p : net->parameters()) total += p.numel();
  ddp::ZeroRedundancyOptimizer optimizer(net->parameters(), comm, adam());

  // The partition: the same on every rank, balanced, and the shard is what this rank steps.
  const std::vector<int>& owners = optimizer.owners();
  ASSERT_EQ(owners.size(), 16u);
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(
      torch::tensor(std::vector<int64_t>(owners.begin(), owners.end()))));
  EXPECT_EQ(optimizer.shard_numel(), total / w);
  EXPECT_EQ(optimizer.shard_optimizer().param_groups()[0].params().size(), 16u / w);

  net->forward(torch::randn({4, 16})).sum().backward();
  optimizer.step();
  int64_t state_bytes = 0;
  for (const auto& [key, state] : optimizer.shard_optimizer().state()) {
    const auto& adam_state = dynamic_cast<const torch::optim::AdamParamState&>(*state);
    state_bytes += adam_state.exp_avg().nbytes() + adam_state.exp_avg_sq().nbytes();
  }
  // Adam's two moments of the shard only: 1/w of the unsharded optimizer's 2 x 4 x 2176 bytes.
  EXPECT_EQ(state_bytes, 2 * 4 * total / w);
}

TEST(ZeroRedundancyOptimizer, RefusesWhatItCannotDo) {
  ddp::Communicator& comm = ddp_test::group().cpu();
  Net net;
  ddp::ZeroRedundancyOptimizer optimizer(net->parameters(), comm, sgd());
  EXPECT_THROW(optimizer.step([] { return torch::zeros({}); }), std::invalid_argument);
  std::vector<torch::Tensor> mixed{torch::zeros({2}, torch::kFloat),
                                   torch::zeros({2}, torch::kDouble)};
  try {
    ddp::ZeroRedundancyOptimizer bad(mixed, comm, sgd());
    ADD_FAILURE() << "mixed dtypes were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 1 is Double"), std::string::npos) << e.what();
  }
}

}  // namespace test_zero

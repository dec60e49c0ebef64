// The hierarchical all-reduce (comm/compose/hierarchical_communicator.h) on one machine, its hosts
// emulated by CpuOptions::host_split (testing::hooks().host_split): at 4 ranks 2 "hosts" of 2 ranks
// (and 1 + 3, 3 + 1), at 2 ranks one host of 2 (hierarchical forced on). Every rank must hold
// bitwise the same result, equal to the flat all-reduce's within rounding (exactly for
// integers, Min and Max); DDP training over it keeps the replicas identical.
#include <ddp/distributed_data_parallel.h>
#include <ddp/process_group.h>
#include "comm/compose/cpu_communicator.h"
#include "comm/compose/hierarchical_communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "util/testing_hooks.h"

#include "fill_check.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace test_hierarchical {

using ddp::HierarchicalAllReduce;
using ddp_test::identical_on_all_ranks;

int world() { return ddp_test::runtime().world_size(); }
int me() { return ddp_test::runtime().rank(); }

// The emulated hosts of these tests: 2 x 2 at 4 ranks, one host of 2 at 2 ranks.
std::vector<int> two_by_two() {
  return world() == 4 ? std::vector<int>{2, 2} : std::vector<int>{world()};
}

std::unique_ptr<ddp::Communicator> hierarchical(std::vector<int> split, bool ring = false) {
  ddp::CpuOptions options;
  options.hierarchical = HierarchicalAllReduce::On;
  options.host_split = std::move(split);
  options.sockets = ring ? ddp::CpuOptions::Sockets::Always : ddp::CpuOptions::Sockets::Never;
  options.socket_bytes = 64 << 10;
  return ddp::make_cpu_communicator(MPI_COMM_WORLD, options);
}

// Each rank's own values: different on every rank, with fractions that make the order of the
// additions show in the last bits.
torch::Tensor values(int64_t n, torch::ScalarType dtype, int rank) {
  torch::manual_seed(1000 + rank);
  if (dtype == torch::kLong || dtype == torch::kInt) return torch::randint(-1000, 1000, {n}, dtype);
  return (torch::randn({n}, torch::kDouble) * 3.7).to(dtype);
}

// All-reduces one rank's values both ways and checks the hierarchical result.
void check_against_flat(ddp::Communicator& hier, ddp::Communicator& flat, int64_t n,
                        torch::ScalarType dtype, ddp::ReduceOp op, const std::string& what) {
  torch::Tensor got = values(n, dtype, me()), want = got.clone();
  hier.all_reduce(got, op);
  flat.all_reduce(want, op);
  EXPECT_TRUE(identical_on_all_ranks(got)) << what << ": the ranks' results differ";
  const bool exact =
      !torch::isFloatingType(dtype) || op == ddp::ReduceOp::Min || op == ddp::ReduceOp::Max;
  if (exact) {
    EXPECT_TRUE(torch::equal(got, want)) << what;
  } else {
    // bf16 rounds every partial sum to 8 bits: another order of the additions moves a result by
    // a few units in the last place of the largest partial sum (|partial sums| < 64: 0.25 each).
    const double tol = dtype == torch::kDouble ? 1e-12 : dtype == torch::kFloat ? 1e-5 : 2e-2;
    const double atol = dtype == torch::kBFloat16 ? 1.0 : tol;
    EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), want.to(torch::kDouble), tol, atol))
        << what << ": max diff "
        << (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>();
  }
}

void check_every_op(const std::vector<int>& split, bool ring) {
  const auto made = hierarchical(split, ring);
  auto* hier = dynamic_cast<ddp::HierarchicalCommunicator*>(made.get());
  ASSERT_NE(hier, nullptr) << "hierarchical on: make_cpu_communicator must make one";
  EXPECT_EQ(hier->hosts(), static_cast<int>(split.size()));
  EXPECT_EQ(hier->leaders_use_ring(), ring && hier->leader() && split.size() > 1);
  ddp::MpiCommunicator flat(MPI_COMM_WORLD);
  const std::string where = "hosts of " + std::to_string(split[0]) +
                            (split.size() > 1 ? "+" + std::to_string(split[1]) : "") +
                            (ring ? ", leaders on the ring" : ", leaders on MPI");
  // 10 elements: the non-blocking MPI calls; 100,000 (400 KB): the blocking ones and the ring.
  for (int64_t n : {10, 100000}) {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kLong}) {
      check_against_flat(*hier, flat, n, dtype, ddp::ReduceOp::Sum,
                         where + ", sum " + std::to_string(n));
      check_against_flat(*hier, flat, n, dtype, ddp::ReduceOp::Max,
                         where + ", max " + std::to_string(n));
    }
    check_against_flat(*hier, flat, n, torch::kFloat, ddp::ReduceOp::Avg,
                       where + ", avg " + std::to_string(n));
    check_against_flat(*hier, flat, n, torch::kInt, ddp::ReduceOp::Min,
                       where + ", min " + std::to_string(n));
    check_against_flat(*hier, flat, n, torch::kBFloat16, ddp::ReduceOp::Sum,
                       where + ", bf16 " + std::to_string(n));
  }
  // The other collectives are the flat MPI communicator's.
  torch::Tensor root = torch::full({4}, me() == 0 ? 7.0 : -1.0);
  hier->broadcast(root, 0);
  EXPECT_TRUE(torch::equal(root, torch::full({4}, 7.0)));
  EXPECT_EQ(hier->all_gather(torch::tensor({me()})).sum().item<int64_t>(),
            world() * (world() - 1) / 2);
  hier->barrier();
}

TEST(HierarchicalAllReduce, SameBitsOnEveryRankAndTheFlatResult) {
  if (world() < 2) GTEST_SKIP() << "needs 2 or 4 ranks";
  check_every_op(two_by_two(), /*ring=*/false);
  check_every_op(two_by_two(), /*ring=*/true);
}

TEST(HierarchicalAllReduce, UnequalRanksPerHost) {
  if (world() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_every_op({1, 3}, /*ring=*/false);
  check_every_op({3, 1}, /*ring=*/true);
}

TEST(HierarchicalAllReduce, AsynchronousCallsKeepTheirOrder) {
  // Several all-reduces in flight, then a blocking one: each result is its own.
  if (world() < 2) GTEST_SKIP() << "needs 2 or 4 ranks";
  const auto hier = hierarchical(two_by_two(), /*ring=*/true);
  std::vector<torch::Tensor> tensors;
  std::vector<std::unique_ptr<ddp::Work>> works;
  for (int i = 0; i < 6; ++i) {
    tensors.push_back(torch::full({i % 2 ? 50000 : 3}, static_cast<double>(i + me())));
    works.push_back(hier->all_reduce_async(tensors.back()));
  }
  torch::Tensor last = torch::ones({2});
  hier->all_reduce(last);
  for (auto& work : works) work->wait();
  for (int i = 0; i < 6; ++i) {
    const double want = world() * i + world() * (world() - 1) / 2.0;
    EXPECT_TRUE(torch::equal(tensors[i], torch::full_like(tensors[i], want))) << "all-reduce " << i;
  }
  EXPECT_TRUE(torch::equal(last, torch::full({2}, static_cast<double>(world()))));
}

TEST(HierarchicalAllReduce, AllReduceAfterFillFillsOnTheWorker) {
  if (world() < 2) GTEST_SKIP() << "needs 2 or 4 ranks";
  const auto hier = hierarchical(two_by_two(), /*ring=*/true);
  ddp_test::check_all_reduce_after_fill(*hier, 50000, /*on_worker=*/true, "hierarchical");
}

TEST(HierarchicalAllReduce, ChosenFromTheHosts) {
  using H = HierarchicalAllReduce;
  // Hosts named by their lowest rank, one entry per rank.
  const std::vector<int> two_by_two{0, 0, 2, 2}, one_each{0, 1, 2, 3}, one_host{0, 0, 0, 0},
      round_robin{0, 1, 0, 1}, uneven{0, 1, 1, 1};
  EXPECT_TRUE(ddp::hierarchical_wanted(H::Auto, two_by_two));
  EXPECT_TRUE(ddp::hierarchical_wanted(H::Auto, round_robin));  // mpirun --map-by node
  EXPECT_TRUE(ddp::hierarchical_wanted(H::Auto, uneven));
  EXPECT_FALSE(ddp::hierarchical_wanted(H::Auto, one_each));  // nothing to reduce on a host
  EXPECT_FALSE(ddp::hierarchical_wanted(H::Auto, one_host));  // no link between hosts
  EXPECT_TRUE(ddp::hierarchical_wanted(H::On, one_host));
  EXPECT_TRUE(ddp::hierarchical_wanted(H::On, one_each));
  EXPECT_FALSE(ddp::hierarchical_wanted(H::Off, two_by_two));
  EXPECT_FALSE(ddp::hierarchical_wanted(H::On, {0}));  // one rank: nothing to reduce
}

TEST(HierarchicalAllReduce, OnWithOneHostIsAReduceAndABroadcast) {
  if (world() < 2) GTEST_SKIP() << "needs 2 or 4 ranks";
  const auto made = hierarchical({world()});
  auto* hier = dynamic_cast<ddp::HierarchicalCommunicator*>(made.get());
  ASSERT_NE(hier, nullptr);
  EXPECT_EQ(hier->hosts(), 1);
  EXPECT_EQ(hier->leader(), me() == 0);
  torch::Tensor t = torch::full({5}, static_cast<int64_t>(me() + 1));
  hier->all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::full({5}, static_cast<int64_t>(world() * (world() + 1) / 2))));
}

TEST(HierarchicalAllReduce, AutoStaysFlatOnOneHostAndABadSplitIsNamed) {
  ddp::CpuOptions options;  // Auto, the real hosts: this machine alone
  const auto made = ddp::make_cpu_communicator(MPI_COMM_WORLD, options);
  EXPECT_EQ(dynamic_cast<ddp::HierarchicalCommunicator*>(made.get()), nullptr);
  EXPECT_EQ(made->backend(), "mpi");
  options.host_split = {world() + 1};
  try {
    ddp::make_cpu_communicator(MPI_COMM_WORLD, options);
    ADD_FAILURE() << "a split that does not add up to the ranks must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(
        std::string(e.what()).find("CpuOptions::host_split '" + std::to_string(world() + 1) + "'"),
        std::string::npos)
        << e.what();
  }
}

// A few DDP steps over ProcessGroups made as a program makes them, hierarchical (2 x 2 through
// testing::hooks().host_split, leaders on the ring) and flat: the replicas stay identical, and the
// two trainings agree within rounding.
TEST(HierarchicalAllReduce, DdpTrainingKeepsReplicasIdenticalAndMatchesFlat) {
  if (world() < 2) GTEST_SKIP() << "needs 2 or 4 ranks";
  std::vector<torch::Tensor> losses[2], states[2];
  for (int pass = 0; pass < 2; ++pass) {
    const bool hier = pass == 0;
    if (hier) {
      ddp::testing::hooks().host_split = two_by_two();
      setenv("DDP_MPI_SOCKETS", "always", 1);
    }
    ddp::ProcessGroupOptions group_options;
    group_options.hierarchical = hier ? HierarchicalAllReduce::On : HierarchicalAllReduce::Off;
    ddp::ProcessGroup group(ddp_test::runtime(), group_options);
    ddp::testing::hooks().host_split.clear();
    unsetenv("DDP_MPI_SOCKETS");
    EXPECT_EQ(group.cpu().backend(), hier ? "mpi-hierarchical" : "mpi");

    torch::manual_seed(5);
    auto net = std::make_shared<torch::nn::SequentialImpl>(
        torch::nn::Linear(10, 2048), torch::nn::ReLU(), torch::nn::Linear(2048, 3));
    ddp::DDPOptions options;
    options.first_bucket_mb = 0.01;  // several buckets, small and large
    ddp::DistributedDataParallel model(group, net, options);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::manual_seed(11 + me());
    for (int step = 0; step < 4; ++step) {
      const torch::Tensor x = torch::randn({8, 10}), y = torch::randint(0, 3, {8}, torch::kLong);
      opt.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(net->forward(x), y);
      loss.backward();
      opt.step();
      torch::Tensor mean = loss.detach().reshape({1}).clone();
      group.cpu().all_reduce(mean, ddp::ReduceOp::Avg);
      losses[pass].push_back(mean);
    }
    std::vector<torch::Tensor> flat;
    for (const auto& p : net->parameters()) flat.push_back(p.detach().flatten());
    states[pass].push_back(torch::cat(flat));
    EXPECT_TRUE(identical_on_all_ranks(states[pass][0])) << (hier ? "hierarchical" : "flat");
  }
  for (size_t s = 0; s < losses[0].size(); ++s) {
    EXPECT_NEAR(losses[0][s].item<float>(), losses[1][s].item<float>(), 1e-5) << "step " << s;
  }
  EXPECT_TRUE(torch::allclose(states[0][0], states[1][0], 1e-5, 1e-6))
      << "max diff " << (states[0][0] - states[1][0]).abs().max().item<float>();
}

}  // namespace test_hierarchical

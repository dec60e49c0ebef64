// The in-process communicator of replica threads (comm/replica_communicator.h), without MPI: one
// process (the hub reduces in memory only) and a fake second process (a process communicator
// that acts as if another process held the same tensors). Plus the per-replica generator
// (util/generator.h) and ddp::dropout (nn/dropout.h) that make N replicas draw what N ranks draw.
#include "comm/replica_communicator.h"
#include <ddp/train/dropout.h>
#include "parallel/generator.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// Runs body(replica) on one thread per replica; returns the first exception's message per
// replica ("" when it returned). Fails the test instead of hanging when a thread is not done
// within 20 s.
std::vector<std::string> run_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::future<std::string>> results;
  for (int r = 0; r < n; ++r) {
    results.push_back(std::async(std::launch::async, [&body, r]() -> std::string {
      try {
        body(r);
        return "";
      } catch (const ddp::ReplicasAborted& e) {
        return std::string("aborted: ") + e.what();
      } catch (const std::exception& e) {
        return e.what();
      }
    }));
  }
  std::vector<std::string> messages;
  for (auto& result : results) {
    if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "a replica thread hangs";
      std::abort();  // a blocked std::async future would block the test binary forever
    }
    messages.push_back(result.get());
  }
  return messages;
}

// Acts as the communicator over 2 processes, the other of which holds the same tensors as this
// one: what the hub hands it must be this process's partial result.
class MirrorProcess final : public ddp::Communicator {
 public:
  std::string backend() const override { return "mirror"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::unique_ptr<ddp::Work> all_reduce_async(const torch::Tensor& t, ddp::ReduceOp op) override {
    EXPECT_NE(op, ddp::ReduceOp::Avg) << "the hub averages over all replicas itself";
    if (op == ddp::ReduceOp::Sum) t.mul_(2);
    struct Done : ddp::Work {
      void wait() override {}
      std::exception_ptr error() const override { return nullptr; }
    };
    return std::make_unique<Done>();
  }
  void broadcast(const torch::Tensor& t, int root) override { EXPECT_EQ(root, 0); (void)t; }
  torch::Tensor all_gather(const torch::Tensor& t) override { return torch::stack({t, t}); }
  void barrier() override {}
};

TEST(ReplicaCommunicator, RanksAreGlobalReplicaIndices) {
  ddp::ReplicaHub hub(3, 0, 1, nullptr);
  run_threads(3, [&](int r) {
    auto comm = hub.communicator(r);
    EXPECT_EQ(comm->rank(), r);
    EXPECT_EQ(comm->size(), 3);
  });
  // Process 1 of 2 with 2 replicas: replicas 2 and 3 of 4.
  ddp::ReplicaHub second(2, 1, 2, [] { return std::unique_ptr<ddp::Communicator>(new MirrorProcess); });
  run_threads(2, [&](int r) {
    auto comm = second.communicator(r);
    EXPECT_EQ(comm->rank(), 2 + r);
    EXPECT_EQ(comm->size(), 4);
  });
  EXPECT_THROW(ddp::ReplicaHub(0, 0, 1, nullptr), std::invalid_argument);
  EXPECT_THROW(ddp::ReplicaHub(2, 2, 2, [] { return std::unique_ptr<ddp::Communicator>(); }),
               std::invalid_argument);
  EXPECT_THROW(ddp::ReplicaHub(2, 0, 2, nullptr), std::invalid_argument);
}

TEST(ReplicaCommunicator, AllReduceEveryOpGivesEveryReplicaTheResult) {
  const int n = 3;
  ddp::ReplicaHub hub(n, 0, 1, nullptr);
  run_threads(n, [&](int r) {
    auto comm = hub.communicator(r);
    const float v = static_cast<float>(r + 1);  // 1, 2, 3
    torch::Tensor sum = torch::full({5}, v), avg = torch::full({5}, v);
    torch::Tensor mx = torch::full({5}, v), mn = torch::full({5}, v);
    torch::Tensor count = torch::full({2}, r + 1, torch::kLong);
    // Queued together, waited in another order: each has its own result.
    auto w1 = comm->all_reduce_async(sum, ddp::ReduceOp::Sum);
    auto w2 = comm->all_reduce_async(avg, ddp::ReduceOp::Avg);
    comm->all_reduce(mx, ddp::ReduceOp::Max);
    comm->all_reduce(mn, ddp::ReduceOp::Min);
    comm->all_reduce(count, ddp::ReduceOp::Sum);
    w2->wait();
    w1->wait();
    EXPECT_TRUE(sum.equal(torch::full({5}, 6.0f))) << sum;
    EXPECT_TRUE(avg.equal(torch::full({5}, 2.0f))) << avg;
    EXPECT_TRUE(mx.equal(torch::full({5}, 3.0f))) << mx;
    EXPECT_TRUE(mn.equal(torch::full({5}, 1.0f))) << mn;
    EXPECT_TRUE(count.equal(torch::full({2}, 6, torch::kLong))) << count;
    EXPECT_EQ(w1->error(), nullptr);
  });
}

TEST(ReplicaCommunicator, SumsInReplicaOrderWhicheverThreadComesLast) {
  // In float, (1e8 + 1) - 1e8 is 0 (1e8 + 1 rounds to 1e8), while 1e8 + (1 - 1e8) is 8 and
  // (1e8 - 1e8) + 1 is 1: only replica order 0, 1, 2 gives 0. The threads arrive in the
  // opposite order, and in another one.
  const std::vector<float> values = {1e8f, 1.0f, -1e8f};
  for (const std::vector<int>& delays_ms : {std::vector<int>{60, 30, 0}, {0, 60, 30}}) {
    ddp::ReplicaHub hub(3, 0, 1, nullptr);
    run_threads(3, [&](int r) {
      auto comm = hub.communicator(r);
      std::this_thread::sleep_for(std::chrono::milliseconds(delays_ms[r]));
      torch::Tensor t = torch::full({1}, values[r]);
      comm->all_reduce(t, ddp::ReduceOp::Sum);
      EXPECT_EQ(t.item<float>(), 0.0f);
    });
  }
}

TEST(ReplicaCommunicator, BroadcastAllGatherBarrierAndChannels) {
  const int n = 3;
  ddp::ReplicaHub hub(n, 0, 1, nullptr);
  run_threads(n, [&](int r) {
    auto comm = hub.communicator(r);
    auto other = hub.communicator(r);  // a second channel: its own sequence of collectives
    torch::Tensor b = torch::full({2, 2}, static_cast<double>(10 * r), torch::kDouble);
    comm->broadcast(b, 2);
    EXPECT_TRUE(b.equal(torch::full({2, 2}, 20.0, torch::kDouble))) << b;
    torch::Tensor g = other->all_gather(torch::tensor({r, -r}, torch::kLong));
    EXPECT_TRUE(g.equal(torch::tensor({{0, 0}, {1, -1}, {2, -2}}, torch::kLong))) << g;
    comm->barrier();
    const auto names = ddp::all_gather_strings(*comm, "replica " + std::to_string(r));
    ASSERT_EQ(names.size(), 3u);
    EXPECT_EQ(names[1], "replica 1");
    EXPECT_THROW(comm->broadcast(b, 3), std::invalid_argument);
  });
}

TEST(ReplicaCommunicator, PartialResultsGoToTheProcessCommunicator) {
  int made = 0;
  ddp::ReplicaHub hub(2, 0, 2, [&] {
    ++made;
    return std::unique_ptr<ddp::Communicator>(new MirrorProcess);
  });
  run_threads(2, [&](int r) {
    auto comm = hub.communicator(r);
    EXPECT_EQ(comm->size(), 4);
    torch::Tensor sum = torch::full({3}, static_cast<float>(r + 1));  // 1 + 2 here, twice
    comm->all_reduce(sum, ddp::ReduceOp::Sum);
    EXPECT_TRUE(sum.equal(torch::full({3}, 6.0f))) << sum;
    torch::Tensor avg = torch::full({3}, static_cast<float>(r + 1));
    comm->all_reduce(avg, ddp::ReduceOp::Avg);  // 6 / 4 replicas
    EXPECT_TRUE(avg.equal(torch::full({3}, 1.5f))) << avg;
    torch::Tensor g = comm->all_gather(torch::tensor({r}, torch::kLong));
    EXPECT_TRUE(g.equal(torch::tensor({{0}, {1}, {0}, {1}}, torch::kLong))) << g;  // [4, 1]
  });
  EXPECT_EQ(made, 1);  // one channel, one process communicator
}

TEST(ReplicaCommunicator, AFailingReplicaEndsTheOthersWaitsWithoutAHang) {
  ddp::ReplicaHub hub(3, 0, 1, nullptr);
  const auto messages = run_threads(3, [&](int r) {
    auto comm = hub.communicator(r);
    torch::Tensor t = torch::ones({4});
    comm->all_reduce(t);  // all three: fine
    if (r == 1) {
      // What run_replicas does for a replica whose body throws.
      hub.abort("replica 1 failed: deliberate");
      throw std::runtime_error("deliberate");
    }
    auto work = comm->all_reduce_async(t);  // replica 1 never comes
    work->wait();
  });
  EXPECT_EQ(messages[1], "deliberate");
  EXPECT_EQ(messages[0], "aborted: replica 1 failed: deliberate");
  EXPECT_EQ(messages[2], "aborted: replica 1 failed: deliberate");
  EXPECT_TRUE(hub.aborted());
  EXPECT_THROW(hub.communicator(0), ddp::ReplicasAborted);  // later calls too
}

TEST(ReplicaCommunicator, AHungReplicaEndsTheOthersWaitsAtTheTimeout) {
  // Replica 2 hangs in its own code (it never calls the collectives): with a 1 s timeout the
  // all-reduce of replica 0 and the barrier of replica 1 end, the first to time out naming the
  // collective and the replica that never came, the other aborted with that reason.
  ddp::ReplicaHub hub(3, 0, 1, nullptr, std::chrono::seconds(1));
  std::vector<std::unique_ptr<ddp::Communicator>> comms;
  for (int r = 0; r < 3; ++r) comms.push_back(hub.communicator(r));
  const auto start = std::chrono::steady_clock::now();
  const auto messages = run_threads(2, [&](int r) {
    torch::Tensor t = torch::ones({4});
    if (r == 0) {
      comms[0]->all_reduce(t);
    } else {
      comms[1]->all_reduce(t);
      comms[1]->barrier();
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 1.0);
  const std::string timed_out =
      "replica communicator: all_reduce #0 unfinished 1 s after this replica entered it "
      "(ProcessGroupOptions::timeout): replica(s) 2 (the job's 2) of this process never came "
      "(hung in their own code, or calling another collective)";
  // Replicas 0 and 1 wait in the same all-reduce: either may time out first.
  EXPECT_TRUE((messages[0] == timed_out && messages[1] == "aborted: " + timed_out) ||
              (messages[1] == timed_out && messages[0] == "aborted: " + timed_out))
      << messages[0] << "\n" << messages[1];
  EXPECT_TRUE(hub.aborted());
}

TEST(ReplicaCommunicator, ReplicasIssuingDifferentCollectivesAreStopped) {
  ddp::ReplicaHub hub(2, 0, 1, nullptr);
  const auto messages = run_threads(2, [&](int r) {
    auto comm = hub.communicator(r);
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    torch::Tensor t = torch::ones({2});
    if (r == 0) {
      comm->broadcast(t, 0);
    } else {
      comm->all_reduce(t);
    }
  });
  EXPECT_NE(messages[0].find("every replica must issue the same collectives"), std::string::npos)
      << messages[0];
  EXPECT_NE(messages[1].find("aborted: "), std::string::npos) << messages[1];
}

TEST(ReplicaGenerator, DropoutDrawsLikeTorchDropoutFromTheSameState) {
  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({64, 33});
  at::Generator global = torch::globalContext().defaultGenerator(torch::kCPU);
  const torch::Tensor state = global.get_state();
  const torch::Tensor expected = torch::dropout(x, 0.25, /*train=*/true);
  global.set_state(state);
  EXPECT_TRUE(ddp::dropout(x, 0.25, true).equal(expected));
  EXPECT_TRUE(ddp::dropout(x, 0.25, false).equal(x));
  EXPECT_THROW(ddp::dropout(x, 1.5, true), std::invalid_argument);
}

// What a rank does: manual_seed, build (draws), then dropout draws. Replica threads with
// build_seeded must draw exactly that, each, however the threads interleave.
TEST(ReplicaGenerator, EachReplicaDrawsWhatARankDraws) {
  const torch::Tensor x = torch::ones({1000});
  torch::Tensor init_expected, masks_expected;
  torch::manual_seed(3);
  init_expected = torch::rand({10});
  masks_expected = torch::stack({ddp::dropout(x, 0.5, true), ddp::dropout(x, 0.5, true)});

  std::vector<torch::Tensor> init(4), masks(4);
  run_threads(4, [&](int r) {
    ddp::ThreadCpuGenerator mine;
    ddp::build_seeded(3, torch::kCPU, [&] { init[r] = torch::rand({10}); });
    std::vector<torch::Tensor> drawn;
    // Meanwhile the other replicas draw from their own generators.
    for (int i = 0; i < 2; ++i) drawn.push_back(ddp::dropout(x, 0.5, true));
    masks[r] = torch::stack(drawn);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(init[r].equal(init_expected)) << "replica " << r;
    EXPECT_TRUE(masks[r].equal(masks_expected)) << "replica " << r;
  }
  // Outside replica threads nothing changed: cpu_generator() is LibTorch's default.
  EXPECT_EQ(ddp::cpu_generator(), torch::globalContext().defaultGenerator(torch::kCPU));
}

}  // namespace

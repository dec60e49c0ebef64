// The NCCL communicator on real GPUs: every collective and dtype, the stream ordering that
// replaces host synchronisation, and the argument checks. Run under mpirun (one rank per GPU);
// every test skips on a rank without a CUDA device.
#include "comm/nccl/nccl_communicator.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

// Enough GPU cycles (about half a second) that the host reaches its next check long before
// the kernel ends.
constexpr int64_t kLongSleepCycles = 1'000'000'000;

const std::vector<torch::ScalarType> kFloatTypes = {torch::kFloat, torch::kDouble, torch::kHalf,
                                                    torch::kBFloat16};
const std::vector<torch::ScalarType> kIntTypes = {torch::kInt, torch::kLong, torch::kByte};

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!pg().has_gpu()) GTEST_SKIP() << "no CUDA device on this rank";
  }
  ddp::NcclCommunicator& comm() { return dynamic_cast<ddp::NcclCommunicator&>(pg().gpu()); }
  torch::TensorOptions on_gpu(torch::ScalarType type) const {
    return torch::TensorOptions().dtype(type).device(rt().device());
  }
};

TEST_F(Nccl, CommunicatorMatchesTheRuntime) {
  EXPECT_EQ(comm().backend(), "nccl");
  EXPECT_EQ(comm().rank(), rt().rank());
  EXPECT_EQ(comm().size(), rt().world_size());
  EXPECT_EQ(comm().device(), rt().device());
  EXPECT_NE(comm().stream(), c10::cuda::getCurrentCUDAStream(rt().device().index()));
}

TEST_F(Nccl, AllReduceEveryDtypeAndOp) {
  const double n = rt().world_size();
  const double mine = rt().rank() + 1;  // ranks hold 1..n
  struct Case {
    ddp::ReduceOp op;
    double expected;
  };
  const std::vector<Case> float_cases = {{ddp::ReduceOp::Sum, n * (n + 1) / 2},
                                         {ddp::ReduceOp::Avg, (n + 1) / 2},
                                         {ddp::ReduceOp::Min, 1},
                                         {ddp::ReduceOp::Max, n}};
  for (torch::ScalarType type : kFloatTypes) {
    for (const Case& c : float_cases) {
      torch::Tensor t = torch::full({37}, mine, on_gpu(type));
      comm().all_reduce(t, c.op);
      const torch::Tensor want = torch::full({37}, c.expected, torch::kDouble);
      EXPECT_TRUE(torch::equal(t.cpu().to(torch::kDouble), want))
          << type << " op " << static_cast<int>(c.op) << ": " << t[0].item<double>();
    }
  }
  for (torch::ScalarType type : kIntTypes) {
    for (const Case& c : {float_cases[0], float_cases[2], float_cases[3]}) {
      torch::Tensor t = torch::full({5}, mine, on_gpu(type));
      comm().all_reduce(t, c.op);
      EXPECT_EQ(t.cpu().to(torch::kDouble)[4].item<double>(), c.expected) << type;
    }
  }
}

TEST_F(Nccl, AvgNeedsAFloatingPointTensor) {
  torch::Tensor t = torch::ones({3}, on_gpu(torch::kInt));
  try {
    comm().all_reduce(t, ddp::ReduceOp::Avg);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Avg needs a floating-point tensor"), std::string::npos)
        << e.what();
  }
}

TEST_F(Nccl, BroadcastEveryDtypeFromTheLastRank) {
  const int root = rt().world_size() - 1;
  for (const auto& types : {kFloatTypes, kIntTypes}) {
    for (torch::ScalarType type : types) {
      torch::Tensor t = torch::full({4, 3}, rt().rank() == root ? 7 : 0, on_gpu(type));
      comm().broadcast(t, root);
      EXPECT_TRUE(torch::equal(t.cpu(), torch::full({4, 3}, 7, torch::TensorOptions(type))))
          << type;
    }
  }
  torch::Tensor t = torch::zeros({1}, on_gpu(torch::kFloat));
  EXPECT_THROW(comm().broadcast(t, rt().world_size()), std::invalid_argument);
}

TEST_F(Nccl, AllGatherEveryDtypeInRankOrder) {
  const int n = rt().world_size();
  for (const auto& types : {kFloatTypes, kIntTypes}) {
    for (torch::ScalarType type : types) {
      const torch::Tensor gathered =
          comm().all_gather(torch::full({2, 3}, rt().rank(), on_gpu(type)));
      ASSERT_EQ(gathered.sizes(), (std::vector<int64_t>{n, 2, 3})) << type;
      EXPECT_EQ(gathered.device(), rt().device());
      for (int r = 0; r < n; ++r) {
        const torch::Tensor want = torch::full({2, 3}, r, torch::TensorOptions(type));
        EXPECT_TRUE(torch::equal(gathered[r].cpu(), want)) << type << ", rank " << r;
      }
    }
  }
}

TEST_F(Nccl, RejectsCpuAndNonContiguousTensors) {
  torch::Tensor cpu = torch::ones({3});
  try {
    comm().all_reduce(cpu);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the tensor is on cpu"), std::string::npos) << e.what();
  }
  torch::Tensor transposed = torch::ones({3, 4}, on_gpu(torch::kFloat)).t();
  EXPECT_THROW(comm().broadcast(transposed), std::invalid_argument);
  EXPECT_THROW(comm().all_reduce(torch::ones({2}, on_gpu(torch::kBool))), std::invalid_argument);
}

// The collective waits for the work queued before it on the current stream, the current stream
// waits for the collective, and the host waits for neither.
TEST_F(Nccl, CollectivesAreOrderedByStreamsNotByTheHost) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(rt().device().index());
  torch::Tensor x = torch::zeros({1 << 20}, on_gpu(torch::kFloat));
  at::cuda::sleep(kLongSleepCycles);
  x.fill_(rt().rank() + 1);  // runs after the sleep
  const torch::Tensor gathered = comm().all_gather(x);
  EXPECT_FALSE(current.query()) << "all_gather made the host wait for the GPU";
  for (int r = 0; r < rt().world_size(); ++r) {
    EXPECT_EQ(gathered[r].min().item<float>(), r + 1.0f) << "gathered before fill_ ran";
    EXPECT_EQ(gathered[r].max().item<float>(), r + 1.0f) << "gathered before fill_ ran";
  }
}

// all_reduce_async leaves the host and the current stream free until wait(): that is the overlap.
// Each check says which of the two waited (the first H100 run, 2026-11-24, saw the NCCL stream idle
// after current.synchronize(), without saying where the wait was).
TEST_F(Nccl, AsyncAllReduceHoldsTheCurrentStreamOnlyFromWait) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(rt().device().index());
  torch::Tensor t = torch::full({1000}, rt().rank() + 1.0, on_gpu(torch::kFloat));
  // Every kernel launched between the sleep and the checks runs once first. CUDA loads a kernel's
  // module on its first launch (lazy loading, the default since CUDA 12.2), and loading may
  // synchronize the whole context: the first `ones * 3` would then wait for the sleep on the NCCL
  // stream, and the test would blame the all-reduce (the first H100 run failed here).
  torch::Tensor warm = torch::full({1000}, 1.0, on_gpu(torch::kFloat));
  comm().all_reduce(warm, ddp::ReduceOp::Sum);
  ASSERT_EQ((torch::ones({10}, on_gpu(torch::kFloat)) * 3).sum().item<float>(), 30.0f);
  {
    // Busy the NCCL stream, so the all-reduce queued behind it cannot finish for a while.
    c10::cuda::CUDAStreamGuard on_nccl(comm().stream());
    at::cuda::sleep(kLongSleepCycles);
  }
  ASSERT_FALSE(comm().stream().query())
      << "the sleep on the NCCL stream ended before the test looked";
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<ddp::Work> work = comm().all_reduce_async(t, ddp::ReduceOp::Sum);
  const double call_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(comm().stream().query())
      << "all_reduce_async returned only once the NCCL stream was idle: the host waited for it ("
      << call_ms << " ms in the call)";
  torch::Tensor other = torch::ones({10}, on_gpu(torch::kFloat)) * 3;
  current.synchronize();  // the current stream is not held up by the all-reduce...
  EXPECT_FALSE(comm().stream().query())
      << "current.synchronize() returned only once the NCCL stream was idle: the current stream "
         "waited for the all-reduce before wait()";
  EXPECT_EQ(other.sum().item<float>(), 30.0f);
  work->wait();  // ...until it waits for it
  const double n = rt().world_size();
  EXPECT_EQ(t.sum().item<float>(), static_cast<float>(1000 * n * (n + 1) / 2));
}

TEST_F(Nccl, BarrierReturnsOnlyWhenTheNcclStreamIsDone) {
  {
    c10::cuda::CUDAStreamGuard on_nccl(comm().stream());
    at::cuda::sleep(kLongSleepCycles / 4);
  }
  comm().barrier();
  EXPECT_TRUE(comm().stream().query());
}

}  // namespace

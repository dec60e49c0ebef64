// The backend choice on a real Runtime (multi-rank): CPU models reduce over MPI, and asking for
// NCCL where it cannot work fails on every rank, naming the option, before any collective that
// could leave a rank waiting.
#include <ddp/distributed_data_parallel.h>
#include "parallel/reducer.h"
#include "parallel/resolve_backend.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace test_backend {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Backend, AutoReducesACpuModelOverMpi) {
  torch::nn::Linear net(4, 2);
  ddp::DistributedDataParallel model(pg(), net.ptr());
  EXPECT_EQ(model.options().backend, ddp::Backend::Mpi);
  net->forward(torch::ones({1, 4})).sum().backward();
  // d(sum(Wx + b))/db = 1 on every rank, so the average is 1.
  EXPECT_TRUE(torch::equal(net->bias.grad(), torch::ones({2})));
}

TEST(Backend, ExplicitNcclForACpuModelFailsOnEveryRankNamingTheOption) {
  torch::nn::Linear net(4, 2);
  ddp::DDPOptions options;
  options.backend = ddp::Backend::Nccl;
  try {
    ddp::DistributedDataParallel model(pg(), net.ptr(), options);
    FAIL() << "no exception on rank " << rt().rank();
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "DDPOptions::backend is nccl, but the parameters are on cpu"))
        << e.what();
  }
  // The pure backend choice says the same.
  EXPECT_THROW(ddp::resolve_backend(ddp::Backend::Nccl, torch::kCPU, rt().device(),
                                    ddp::nccl_communicator_built()),
               std::invalid_argument);
}

TEST(Backend, GpuCommunicatorOnACpuRankSaysWhy) {
  if (rt().device().is_cuda()) GTEST_SKIP() << "this rank has a GPU";
  EXPECT_FALSE(pg().has_gpu());
  try {
    pg().gpu();
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "rank " + std::to_string(rt().rank()) +
                                       " has no NCCL communicator: it computes on the CPU"))
        << e.what();
  }
}

// SyncBatchNorm's communicator: a fresh MPI one for CPU layers, and on a CPU rank the same
// explanation as ProcessGroup::gpu() for CUDA ones.
TEST(Backend, CommunicatorForTheCpuIsAnMpiCommunicatorOverAllRanks) {
  const std::shared_ptr<ddp::Communicator> comm = pg().for_device(torch::kCPU);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), rt().rank());
  EXPECT_EQ(comm->size(), rt().world_size());
  torch::Tensor x = torch::full({3}, static_cast<double>(rt().rank() + 1), torch::kDouble);
  comm->all_reduce(x);
  const double n = rt().world_size();
  EXPECT_TRUE(torch::equal(x, torch::full({3}, n * (n + 1) / 2, torch::kDouble)));

  if (rt().device().is_cuda()) return;
  try {
    pg().for_device(torch::kCUDA);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "has no NCCL communicator: it computes on the CPU")) << e.what();
  }
}

}  // namespace test_backend

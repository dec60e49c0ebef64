#include <ddp/runtime.h>

#include "runtime/launcher.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/cuda.h>

#include <malloc.h>
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace test_runtime {

TEST(Runtime, TopologyAgreesWithMpi) {
  const ddp::Runtime& rt = ddp_test::runtime();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(rt.rank(), rank);
  EXPECT_EQ(rt.world_size(), size);
  EXPECT_EQ(rt.is_main(), rank == 0);
  EXPECT_GE(rt.local_rank(), 0);
  EXPECT_LT(rt.local_rank(), rt.local_size());
  EXPECT_LT(rt.node_rank(), rt.num_nodes());
  EXPECT_FALSE(rt.hostname().empty());
  EXPECT_EQ(rt.mpi_thread_level(), MPI_THREAD_MULTIPLE);
}

TEST(Runtime, OneHostMeansOneNode) {
  // The test runs under a plain `mpirun -np N` on one machine.
  const ddp::Runtime& rt = ddp_test::runtime();
  EXPECT_EQ(rt.num_nodes(), 1);
  EXPECT_EQ(rt.node_rank(), 0);
  EXPECT_EQ(rt.local_size(), rt.world_size());
  EXPECT_EQ(rt.local_rank(), rt.rank());
}

TEST(Runtime, DeviceAndSummary) {
  const ddp::Runtime& rt = ddp_test::runtime();
  if (torch::cuda::is_available()) {
    EXPECT_EQ(rt.device(), torch::Device(torch::kCUDA, rt.local_rank()));
  } else {
    EXPECT_EQ(rt.device(), torch::Device(torch::kCPU));
  }
  const std::string line = rt.summary();
  EXPECT_NE(line.find("rank " + std::to_string(rt.rank()) + "/" + std::to_string(rt.world_size())),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("host " + rt.hostname()), std::string::npos) << line;
}

TEST(Runtime, KeepsFreedHostMemoryForTheNextStep) {
#ifndef __GLIBC__
  GTEST_SKIP() << "the policy is glibc malloc's";
#else
  if (!ddp::keep_freed_memory(ddp::current_environment())) {
    GTEST_SKIP() << "the environment tunes malloc itself";
  }
  // A block the size of a CNN's activations comes from the heap, not a mapping of its own whose
  // pages fault in afresh each step, and stays the process's once freed.
  constexpr int64_t bytes = int64_t{24} << 20;
  const struct mallinfo2 before = mallinfo2();
  void* block = std::malloc(bytes);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, bytes);
  const struct mallinfo2 held = mallinfo2();
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  EXPECT_LT(static_cast<int64_t>(held.hblkhd) - static_cast<int64_t>(before.hblkhd), bytes)
      << "the block was mapped on its own";
  EXPECT_GT(static_cast<int64_t>(after.arena) + bytes / 2, static_cast<int64_t>(held.arena))
      << "the heap was trimmed when the block was freed";
#endif
}

TEST(Runtime, WorksWhenMpiIsAlreadyInitialised) {
  const ddp::Runtime& first = ddp_test::runtime();
  {
    ddp::Runtime second;  // MPI is up already: this one must neither init nor finalize it
    EXPECT_EQ(second.rank(), first.rank());
    EXPECT_EQ(second.world_size(), first.world_size());
    EXPECT_EQ(second.local_rank(), first.local_rank());
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0);
  ddp_test::group().cpu().barrier();  // and MPI still works
}

}  // namespace test_runtime

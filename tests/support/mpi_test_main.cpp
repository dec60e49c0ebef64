// main() for the multi-rank tests, run under mpirun with 1, 2 and 4 ranks. Rank 0 prints the
// usual GoogleTest report; other ranks print only their failures, prefixed with their rank. The
// exit code is non-zero on every rank if any rank failed. Built with DDP_TESTS_NEED_CUDA (the GPU
// tests), it exits 77, which ctest reports as skipped, when a rank has no CUDA device.
#include "test_support.h"

#include <gtest/gtest.h>

#include <iostream>

#ifdef DDP_TESTS_NEED_CUDA
#include <torch/cuda.h>
#endif

namespace {

ddp::Runtime* g_runtime = nullptr;
ddp::ProcessGroup* g_group = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
              << result.line_number() << ": Failure\n"
              << result.summary() << std::endl;
  }

 private:
  int rank_;
};

}  // namespace

ddp::Runtime& ddp_test::runtime() { return *g_runtime; }
ddp::ProcessGroup& ddp_test::group() { return *g_group; }

int main(int argc, char** argv) {
  ddp::Runtime runtime(argc, argv);
  ddp::ProcessGroup group(runtime);
  g_runtime = &runtime;
  g_group = &group;
  ::testing::InitGoogleTest(&argc, argv);
#ifdef DDP_TESTS_NEED_CUDA
  // Skipped as a whole, not test by test: GTEST_SKIP alone would leave ctest saying "Passed".
  torch::Tensor no_gpu = torch::tensor({torch::cuda::is_available() ? 0 : 1}, torch::kInt);
  group.cpu().all_reduce(no_gpu, ddp::ReduceOp::Max);
  if (no_gpu.item<int>() != 0) {
    if (runtime.is_main()) {
      std::cout << "skipped: no CUDA device on "
                << (torch::cuda::is_available() ? "another rank" : "rank 0")
                << " (torch::cuda::is_available() is false); the GPU tests need one GPU per rank"
                << std::endl;
    }
    return 77;
  }
#endif
  if (!runtime.is_main()) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(runtime.rank()));
  }
  const int local = RUN_ALL_TESTS();
  torch::Tensor any_failed = torch::tensor({local}, torch::kInt);
  group.cpu().all_reduce(any_failed, ddp::ReduceOp::Max);
  if (runtime.is_main() && any_failed.item<int>() != 0 && local == 0) {
    std::cerr << "rank 0 passed, but another rank failed (see its [rank N] lines)" << std::endl;
  }
  return any_failed.item<int>();
}

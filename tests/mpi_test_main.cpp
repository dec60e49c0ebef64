// main() for the multi-rank tests, run under mpirun with 1, 2 and 4 ranks. Rank 0 prints the
// usual GoogleTest report; other ranks print only their failures, prefixed with their rank. The
// exit code is non-zero on every rank if any rank failed.
#include "test_support.h"

#include <gtest/gtest.h>

#include <iostream>

namespace {

ddp::Runtime* g_runtime = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?")
              << ":" << result.line_number() << ": Failure\n" << result.summary() << std::endl;
  }

 private:
  int rank_;
};

}  // namespace

ddp::Runtime& ddp_test::runtime() { return *g_runtime; }

int main(int argc, char** argv) {
  ddp::Runtime runtime(argc, argv);
  g_runtime = &runtime;
  ::testing::InitGoogleTest(&argc, argv);
  if (!runtime.is_main()) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(runtime.rank()));
  }
  const int local = RUN_ALL_TESTS();
  torch::Tensor any_failed = torch::tensor({local}, torch::kInt);
  runtime.cpu_communicator().all_reduce(any_failed, ddp::ReduceOp::Max);
  if (runtime.is_main() && any_failed.item<int>() != 0 && local == 0) {
    std::cerr << "rank 0 passed, but another rank failed (see its [rank N] lines)" << std::endl;
  }
  return any_failed.item<int>();
}

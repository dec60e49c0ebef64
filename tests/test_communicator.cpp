#include <ddp/comm/communicator.h>
#include <ddp/comm/mpi_communicator.h>

#include "test_support.h"

#include <gtest/gtest.h>

namespace {

ddp::Communicator& comm() { return ddp_test::group().cpu(); }

TEST(MpiCommunicator, AllReduceSumEveryDtype) {
  const int w = comm().size(), r = comm().rank();
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kInt, torch::kLong, torch::kByte}) {
    torch::Tensor t = torch::full({5}, r + 1, dtype);
    comm().all_reduce(t, ddp::ReduceOp::Sum);
    EXPECT_TRUE(torch::equal(t, torch::full({5}, w * (w + 1) / 2, dtype))) << dtype;
  }
}

TEST(MpiCommunicator, AllReduceAvgMinMax) {
  const int w = comm().size(), r = comm().rank();
  torch::Tensor avg = torch::full({3}, static_cast<double>(r), torch::kDouble);
  comm().all_reduce(avg, ddp::ReduceOp::Avg);
  EXPECT_TRUE(torch::allclose(avg, torch::full({3}, (w - 1) / 2.0, torch::kDouble)));

  torch::Tensor lo = torch::tensor({r, -r}, torch::kLong), hi = lo.clone();
  comm().all_reduce(lo, ddp::ReduceOp::Min);
  comm().all_reduce(hi, ddp::ReduceOp::Max);
  EXPECT_TRUE(torch::equal(lo, torch::tensor({0, -(w - 1)}, torch::kLong)));
  EXPECT_TRUE(torch::equal(hi, torch::tensor({w - 1, 0}, torch::kLong)));

  torch::Tensor ints = torch::ones({2}, torch::kInt);
  EXPECT_THROW(comm().all_reduce(ints, ddp::ReduceOp::Avg), std::invalid_argument);
}

TEST(MpiCommunicator, AllReduceHalfAndBFloat16) {
  const int w = comm().size(), r = comm().rank();
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    // Small integers and halves are exact in both formats.
    torch::Tensor t = (torch::arange(8, torch::kFloat) * 0.5 + r).to(dtype);
    comm().all_reduce(t, ddp::ReduceOp::Sum);
    const torch::Tensor want = torch::arange(8, torch::kFloat) * 0.5 * w + w * (w - 1) / 2;
    EXPECT_TRUE(torch::equal(t.to(torch::kFloat), want)) << dtype << " " << t;
    torch::Tensor avg = torch::full({3}, 2.0 * r, dtype);
    comm().all_reduce(avg, ddp::ReduceOp::Avg);
    EXPECT_TRUE(torch::equal(avg.to(torch::kFloat), torch::full({3}, double(w - 1)))) << dtype;
  }
}

TEST(MpiCommunicator, AllReduceLargeTensorIsExact) {
  // 3M elements: integers below 2^24 sum exactly in float32.
  const int r = comm().rank(), w = comm().size();
  torch::Tensor t = torch::arange(3'000'000, torch::kFloat).remainder(1000) + r;
  comm().all_reduce(t, ddp::ReduceOp::Sum);
  torch::Tensor want = (torch::arange(3'000'000, torch::kFloat).remainder(1000)) * w + w * (w - 1) / 2;
  EXPECT_TRUE(torch::equal(t, want));
}

TEST(MpiCommunicator, AllReduceInPiecesGivesTheSameResult) {
  // Pieces of 12 bytes: 3 floats, 1.5 doubles (rounded down to 1), 6 halves; 1001 elements end
  // on a partial piece. Every element must be reduced exactly once, in every dtype.
  const int r = comm().rank(), w = comm().size();
  ddp::MpiOptions options;
  options.max_message_bytes = 12;
  ddp::MpiCommunicator pieces(MPI_COMM_WORLD, options);
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kLong, torch::kHalf}) {
    torch::Tensor t = (torch::arange(1001, torch::kLong).remainder(100) + r).to(dtype);
    pieces.all_reduce(t, ddp::ReduceOp::Sum);
    const torch::Tensor want = torch::arange(1001, torch::kLong).remainder(100) * w + w * (w - 1) / 2;
    EXPECT_TRUE(torch::equal(t.to(torch::kLong), want)) << dtype;
  }
  torch::Tensor avg = torch::full({7}, 2.0 * r);
  pieces.all_reduce(avg, ddp::ReduceOp::Avg);
  EXPECT_TRUE(torch::equal(avg, torch::full({7}, double(w - 1))));
}

TEST(MpiCommunicator, EveryWayOfWaitingGivesTheSameResult) {
  // Blocking all-reduce after an arrival barrier (blocking_bytes 0), non-blocking only (a huge
  // threshold), sleeping at once (spin 0), never sleeping (max_sleep 0): the same sums.
  const int r = comm().rank(), w = comm().size();
  for (int variant = 0; variant < 4; ++variant) {
    ddp::MpiOptions options;
    if (variant == 0) options.blocking_bytes = 0;
    if (variant == 1) options.blocking_bytes = std::size_t(1) << 40;
    if (variant == 2) options.spin = std::chrono::microseconds(0);
    if (variant == 3) options.max_sleep = std::chrono::microseconds(0);
    ddp::MpiCommunicator c(MPI_COMM_WORLD, options);
    for (int64_t n : {int64_t(3), int64_t(100'000)}) {
      torch::Tensor t = torch::arange(n, torch::kLong).remainder(50) + r;
      c.all_reduce(t, ddp::ReduceOp::Sum);
      EXPECT_TRUE(torch::equal(t, torch::arange(n, torch::kLong).remainder(50) * w + w * (w - 1) / 2))
          << "variant " << variant << ", " << n << " elements";
    }
    c.barrier();
  }
}

TEST(MpiCommunicator, DebugModeNamesBothSidesOfAMismatchOnEveryRank) {
  // Every rank gathers every call's fingerprint first: a mismatch throws the same message on
  // every rank, no rank runs the collective, and the communicator stays usable.
  const int r = comm().rank(), w = comm().size();
  ddp::MpiOptions options;
  options.check_collectives = true;
  ddp::MpiCommunicator c(MPI_COMM_WORLD, options);
  torch::Tensor t = torch::ones({2, 5});
  c.all_reduce(t);  // #1: the same everywhere
  EXPECT_TRUE(torch::equal(t, torch::full({2, 5}, double(w))));
  if (w < 2) return;
  std::string message;
  try {
    if (r == 1) {
      c.broadcast(torch::zeros({3}, torch::kLong), 0);
    } else {
      c.all_reduce(torch::zeros({10}), ddp::ReduceOp::Max);
    }
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  // Ranks 2 and 3 call what rank 0 calls: only rank 1 differs, so only rank 1 is named.
  EXPECT_EQ(message,
            "DDP_DEBUG=DETAIL: the ranks call different collectives on one communicator: rank 0 "
            "called all_reduce #2 float32[10] (max) but rank 1 called broadcast #2 int64[3] "
            "(root 0)");
  c.barrier();  // #3: still usable
  torch::Tensor shape = torch::ones({1, 2, 3, 4, 5, 6, 7}, torch::kDouble);
  c.all_reduce(shape);
  EXPECT_EQ(shape.sum().item<double>(), 5040.0 * w);
}

TEST(MpiCommunicator, BroadcastFromLastRank) {
  const int root = comm().size() - 1;
  torch::Tensor t = torch::full({2, 3}, comm().rank() == root ? 7.5 : -1.0);
  comm().broadcast(t, root);
  EXPECT_TRUE(torch::equal(t, torch::full({2, 3}, 7.5)));
}

TEST(MpiCommunicator, AllGatherInRankOrder) {
  torch::Tensor mine = torch::full({3}, comm().rank(), torch::kLong);
  torch::Tensor all = comm().all_gather(mine);
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{comm().size(), 3}));
  for (int r = 0; r < comm().size(); ++r) EXPECT_TRUE(torch::equal(all[r], torch::full({3}, r, torch::kLong)));
}

TEST(MpiCommunicator, AllGatherStringsOfDifferentLengths) {
  const auto all = ddp::all_gather_strings(comm(), "rank" + std::string(comm().rank(), '!'));
  ASSERT_EQ(static_cast<int>(all.size()), comm().size());
  for (int r = 0; r < comm().size(); ++r) EXPECT_EQ(all[r], "rank" + std::string(r, '!'));
}

TEST(MpiCommunicator, RejectsTensorsItCannotSend) {
  torch::Tensor strided = torch::zeros({3, 4}).t();
  EXPECT_THROW(comm().all_reduce(strided), std::invalid_argument);
  torch::Tensor int16 = torch::zeros({2}, torch::kShort);
  EXPECT_THROW(comm().broadcast(int16), std::invalid_argument);
  torch::Tensor half = torch::zeros({2}, torch::kHalf);
  EXPECT_THROW(comm().all_reduce(half, ddp::ReduceOp::Max), std::invalid_argument);
  comm().barrier();
}

}  // namespace

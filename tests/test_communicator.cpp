#include <ddp/communicator.h>
#include "comm/mpi_communicator.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

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

ddp::MpiOptions ring_options() {
  ddp::MpiOptions options;
  options.sockets = ddp::MpiOptions::Sockets::Always;
  options.socket_bytes = 0;  // every all-reduce on the ring
  return options;
}

TEST(MpiCommunicator, SocketRingOnlyWhereAsked) {
  // One host: Auto keeps MPI (shared memory is faster than loopback TCP); Always takes the ring
  // wherever there is more than one rank; Never never does.
  const bool several = comm().size() > 1;
  EXPECT_FALSE(ddp::MpiCommunicator(MPI_COMM_WORLD).uses_socket_ring());
  EXPECT_EQ(ddp::MpiCommunicator(MPI_COMM_WORLD, ring_options()).uses_socket_ring(), several);
  ddp::MpiOptions never;
  never.sockets = ddp::MpiOptions::Sockets::Never;
  EXPECT_FALSE(ddp::MpiCommunicator(MPI_COMM_WORLD, never).uses_socket_ring());
}

TEST(MpiCommunicator, SocketModesByName) {
  for (auto mode : {ddp::MpiOptions::Sockets::Auto, ddp::MpiOptions::Sockets::Never,
                    ddp::MpiOptions::Sockets::Always}) {
    EXPECT_EQ(ddp::parse_sockets(ddp::to_string(mode), "DDP_MPI_SOCKETS"), mode);
  }
  try {
    ddp::parse_sockets("yes", "DDP_MPI_SOCKETS");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "DDP_MPI_SOCKETS='yes': expected auto, never or always");
  }
}

TEST(MpiCommunicator, SocketRingGivesWhatMpiGives) {
  // Every dtype and op, and sizes that leave ring segments empty (1 and 3 elements on 4 ranks),
  // uneven (1001) and large: exact values, so the ring must match MPI element for element.
  const int r = comm().rank(), w = comm().size();
  ddp::MpiCommunicator ring(MPI_COMM_WORLD, ring_options());
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(1001), int64_t(300'000)}) {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kInt, torch::kLong, torch::kByte,
                       torch::kHalf, torch::kBFloat16}) {
      const bool is_float = torch::isFloatingType(dtype);
      for (auto op : {ddp::ReduceOp::Sum, ddp::ReduceOp::Avg, ddp::ReduceOp::Min, ddp::ReduceOp::Max}) {
        if (op == ddp::ReduceOp::Avg && !is_float) continue;
        const bool is_16bit = dtype == torch::kHalf || dtype == torch::kBFloat16;
        if (is_16bit && (op == ddp::ReduceOp::Min || op == ddp::ReduceOp::Max)) continue;
        // Small integers (and halves in the 16-bit floats) are exact in every dtype here.
        torch::Tensor base = (torch::arange(n, torch::kLong).remainder(7) * (r + 1) + r).to(dtype);
        torch::Tensor by_ring = base.clone(), by_mpi = base.clone();
        ring.all_reduce(by_ring, op);
        comm().all_reduce(by_mpi, op);
        EXPECT_TRUE(torch::equal(by_ring, by_mpi))
            << n << " elements, " << dtype << ", op " << static_cast<int>(op);
      }
    }
  }
  // Sums that round: every rank must still hold bitwise the same result.
  torch::Tensor noise = torch::rand({100'003}, torch::TensorOptions().dtype(torch::kFloat)) * (r + 1);
  ring.all_reduce(noise);
  const torch::Tensor all = comm().all_gather(noise);
  for (int k = 1; k < w; ++k) EXPECT_TRUE(torch::equal(all[k], all[0])) << "rank " << k;
}

TEST(MpiCommunicator, SocketRingOnANamedInterface) {
  ddp::MpiOptions options = ring_options();
  options.socket_interfaces = "ddp-no-such-interface,lo";  // the first present one wins
  ddp::MpiCommunicator ring(MPI_COMM_WORLD, options);
  torch::Tensor t = torch::full({5000}, 1.0);
  ring.all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::full({5000}, double(comm().size()))));
}

TEST(MpiCommunicator, SocketRingNamesAMissingInterface) {
  if (comm().size() < 2) return;  // one rank never makes a ring
  ddp::MpiOptions options = ring_options();
  options.socket_interfaces = "ddp-no-such-interface";
  ddp::MpiCommunicator ring(MPI_COMM_WORLD, options);
  std::string message;
  try {
    ring.all_reduce(torch::ones({10}));
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("rank " + std::to_string(comm().rank()) +
                         ": DDP_SOCKET_IFNAME='ddp-no-such-interface' (MpiOptions::socket_interfaces): "
                         "no such interface up with an IPv4 address on this host (it has: lo 127.0.0.1"),
            std::string::npos)
      << message;
}

TEST(MpiCommunicator, SocketRingNamesAPeerThatLeft) {
  // Ranks 0 and 1 make a ring; rank 1 then closes it (as its process would by ending) and rank
  // 0's next all-reduce must fail at once, naming rank 1, instead of waiting.
  if (comm().size() < 2) return;
  const int r = comm().rank();
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r < 2 ? 0 : MPI_UNDEFINED, r, &pair);
  if (pair != MPI_COMM_NULL) {
    auto ring = std::make_unique<ddp::MpiCommunicator>(pair, ring_options());
    torch::Tensor t = torch::ones({1000});
    ring->all_reduce(t);  // makes the ring
    EXPECT_TRUE(torch::equal(t, torch::full({1000}, 2.0)));
    if (r == 1) {
      ring.reset();
    } else {
      // Rank 1's sockets may close before or while rank 0 sends: either way rank 1 is named.
      std::string message;
      try {
        ring->all_reduce(torch::ones({1'000'000}));
      } catch (const std::runtime_error& e) {
        message = e.what();
      }
      EXPECT_NE(message.find("rank 0: socket ring all_reduce: "), std::string::npos) << message;
      EXPECT_NE(message.find(" rank 1 (127.0.0.1:"), std::string::npos) << message;
      EXPECT_NE(message.find("that rank has ended or lost the network"), std::string::npos) << message;
      // Bytes of the failed call may still be in flight: the ring refuses to go on.
      message.clear();
      try {
        ring->all_reduce(torch::ones({10}));
      } catch (const std::runtime_error& e) {
        message = e.what();
      }
      EXPECT_NE(message.find("an earlier all_reduce failed half way"), std::string::npos) << message;
    }
    MPI_Comm_free(&pair);
  }
  comm().barrier();
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

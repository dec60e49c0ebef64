#include <ddp/communicator.h>
#include "comm/collective.h"
#include "comm/compose/cpu_communicator.h"
#include "comm/mpi/inquiry.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/ring/ring_connections.h"
#include "comm/ring/socket_ring.h"
#include "comm/ring/zero_frame.h"
#include "util/environment.h"

#include "fill_check.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace test_communicator {

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
  torch::Tensor want =
      (torch::arange(3'000'000, torch::kFloat).remainder(1000)) * w + w * (w - 1) / 2;
  EXPECT_TRUE(torch::equal(t, want));
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
      EXPECT_TRUE(
          torch::equal(t, torch::arange(n, torch::kLong).remainder(50) * w + w * (w - 1) / 2))
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

// Issue 60: without the debug mode, every collective whose arguments differ on one rank throws on
// every rank, naming both calls, before any byte moves (the tensors are untouched), and the
// communicator stays usable. On MPI alone and with every all-reduce on the TCP ring.
TEST(CpuCommunicator, EveryMismatchIsNamedOnEveryRankByDefault) {
  const int r = comm().rank(), w = comm().size();
  if (w < 2) GTEST_SKIP() << "needs 2 ranks";
  const bool odd = r == 1;  // the rank whose call differs
  struct Case {
    std::string name;
    std::function<void(ddp::Communicator&, torch::Tensor&)> call;
    std::string rank0, rank1;  // the calls, as the message names them (N: the call's number)
  };
  const std::vector<Case> cases{
      {"dtype",
       [&](ddp::Communicator& c, torch::Tensor& t) {
         t = odd ? torch::ones({10}, torch::kInt) : torch::ones({10});
         c.all_reduce(t);
       },
       "all_reduce #N float32[10] (sum)", "all_reduce #N int32[10] (sum)"},
      {"op",
       [&](ddp::Communicator& c, torch::Tensor& t) {
         t = torch::ones({10});
         c.all_reduce(t, odd ? ddp::ReduceOp::Max : ddp::ReduceOp::Sum);
       },
       "all_reduce #N float32[10] (sum)", "all_reduce #N float32[10] (max)"},
      {"root",
       [&](ddp::Communicator& c, torch::Tensor& t) {
         t = torch::ones({10});
         c.broadcast(t, odd ? 1 : 0);
       },
       "broadcast #N float32[10] (root 0)", "broadcast #N float32[10] (root 1)"},
      {"bigger_broadcast",
       [&](ddp::Communicator& c, torch::Tensor& t) {
         t = torch::ones({odd ? 20 : 10});
         c.broadcast(t, 0);
       },
       "broadcast #N float32[10] (root 0)", "broadcast #N float32[20] (root 0)"},
      {"gather_dtype",
       [&](ddp::Communicator& c, torch::Tensor& t) {
         t = odd ? torch::ones({10}, torch::kInt) : torch::ones({10});
         c.all_gather(t);
       },
       "all_gather #N float32[10]", "all_gather #N int32[10]"},
      {"shape",
       [&](ddp::Communicator& c, torch::Tensor& t) {
         t = odd ? torch::ones({5, 4}) : torch::ones({4, 5});
         c.all_reduce(t);
       },
       "all_reduce #N float32[4,5] (sum)", "all_reduce #N float32[5,4] (sum)"},
      {"size",
       [&](ddp::Communicator& c, torch::Tensor& t) {  // the blocking path, and the ring's
         t = torch::ones({odd ? 40000 : 20000});
         c.all_reduce(t);
       },
       "all_reduce #N float32[20000] (sum)", "all_reduce #N float32[40000] (sum)"},
      {"kind",
       [&](ddp::Communicator& c, torch::Tensor& t) {
         t = torch::ones({10});
         if (odd) {
           c.barrier();
         } else {
           c.all_reduce(t);
         }
       },
       "all_reduce #N float32[10] (sum)", "barrier #N"}};
  ddp::CpuOptions on_ring;
  on_ring.sockets = ddp::CpuOptions::Sockets::Always;
  on_ring.socket_bytes = 0;
  std::vector<std::unique_ptr<ddp::Communicator>> communicators;
  communicators.push_back(std::make_unique<ddp::MpiCommunicator>(MPI_COMM_WORLD));
  communicators.push_back(ddp::make_cpu_communicator(MPI_COMM_WORLD, on_ring));
  for (auto& c : communicators) {
    int64_t seq = 0;
    for (const Case& one : cases) {
      torch::Tensor t;
      std::string message;
      try {
        one.call(*c, t);
      } catch (const std::runtime_error& e) {
        message = e.what();
      }
      ++seq;
      auto numbered = [&](std::string call) {
        return call.replace(call.find('N'), 1, std::to_string(seq));
      };
      EXPECT_EQ(message, "the ranks call different collectives on communicator 1: rank 0 called " +
                             numbered(one.rank0) + " but rank 1 called " + numbered(one.rank1) +
                             ". " +
                             (one.name == "kind" ? ddp::detail::mismatch_cause()
                                                 : "Every rank must pass the same dtype, shape, "
                                                   "reduce op and root"))
          << one.name;
      // No rank ran it: every element is still the 1 it was made with.
      EXPECT_TRUE(torch::equal(t, torch::ones_like(t))) << one.name;
      torch::Tensor sum = torch::ones({3});
      c->all_reduce(sum);  // still usable, in step
      ++seq;
      EXPECT_TRUE(torch::equal(sum, torch::full({3}, double(w)))) << one.name;
    }
  }
}

// A ring of its own over every rank: every collective on the ring.
std::unique_ptr<ddp::SocketRing> own_ring(MPI_Comm comm = MPI_COMM_WORLD,
                                          const std::string& interfaces = "") {
  ddp::SocketRingOptions options;
  options.interfaces = interfaces;
  return std::make_unique<ddp::SocketRing>(comm, options);
}

TEST(CpuCommunicator, SocketRingOnlyWhereAsked) {
  // One host: Auto keeps MPI (shared memory is faster than loopback TCP); Always takes the ring
  // wherever there is more than one rank; Never never does. make_cpu_communicator follows.
  using Sockets = ddp::CpuOptions::Sockets;
  const bool several = comm().size() > 1;
  EXPECT_FALSE(ddp::socket_ring_wanted(MPI_COMM_WORLD, Sockets::Auto));
  EXPECT_EQ(ddp::socket_ring_wanted(MPI_COMM_WORLD, Sockets::Always), several);
  EXPECT_FALSE(ddp::socket_ring_wanted(MPI_COMM_WORLD, Sockets::Never));
  for (auto mode : {Sockets::Auto, Sockets::Never, Sockets::Always}) {
    ddp::CpuOptions options;
    options.sockets = mode;
    const auto made = ddp::make_cpu_communicator(MPI_COMM_WORLD, options);
    const bool routed = dynamic_cast<ddp::SizeRoutedCommunicator*>(made.get()) != nullptr;
    EXPECT_EQ(routed, mode == Sockets::Always && several) << ddp::to_string(mode);
    EXPECT_EQ(made->backend(), "mpi");
  }
}

TEST(CpuCommunicator, SocketModesByName) {
  using Sockets = ddp::CpuOptions::Sockets;
  for (auto mode : {Sockets::Auto, Sockets::Never, Sockets::Always}) {
    EXPECT_EQ(ddp::parse_sockets(ddp::to_string(mode), "DDP_MPI_SOCKETS"), mode);
    // The environment's table accepts exactly these names.
    const ddp::Environment env{{"DDP_MPI_SOCKETS", ddp::to_string(mode)}};
    EXPECT_EQ(ddp::read_text(env, ddp::Setting::Sockets), ddp::to_string(mode));
  }
  try {
    ddp::parse_sockets("yes", "DDP_MPI_SOCKETS");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "DDP_MPI_SOCKETS='yes': expected auto, never or always");
  }
  try {
    ddp::read_text({{"DDP_MPI_SOCKETS", "yes"}}, ddp::Setting::Sockets);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "DDP_MPI_SOCKETS='yes': expected auto, never or always");
  }
}

TEST(SocketRing, AllReduceGivesWhatMpiGives) {
  // Every dtype and op, and sizes that leave ring segments empty (1 and 3 elements on 4 ranks),
  // uneven (1001) and large: exact values, so the ring must match MPI element for element.
  const int r = comm().rank(), w = comm().size();
  const auto ring = own_ring();
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(1001), int64_t(300'000)}) {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kInt, torch::kLong, torch::kByte,
                       torch::kHalf, torch::kBFloat16}) {
      const bool is_float = torch::isFloatingType(dtype);
      for (auto op :
           {ddp::ReduceOp::Sum, ddp::ReduceOp::Avg, ddp::ReduceOp::Min, ddp::ReduceOp::Max}) {
        if (op == ddp::ReduceOp::Avg && !is_float) continue;
        const bool is_16bit = dtype == torch::kHalf || dtype == torch::kBFloat16;
        if (is_16bit && (op == ddp::ReduceOp::Min || op == ddp::ReduceOp::Max)) continue;
        // Small integers (and halves in the 16-bit floats) are exact in every dtype here.
        torch::Tensor base = (torch::arange(n, torch::kLong).remainder(7) * (r + 1) + r).to(dtype);
        torch::Tensor by_ring = base.clone(), by_mpi = base.clone();
        ring->all_reduce(by_ring, op);
        comm().all_reduce(by_mpi, op);
        EXPECT_TRUE(torch::equal(by_ring, by_mpi))
            << n << " elements, " << dtype << ", op " << static_cast<int>(op);
      }
    }
  }
  // Sums that round: every rank must still hold bitwise the same result.
  torch::Tensor noise =
      torch::rand({100'003}, torch::TensorOptions().dtype(torch::kFloat)) * (r + 1);
  ring->all_reduce(noise);
  const torch::Tensor all = comm().all_gather(noise);
  for (int k = 1; k < w; ++k) EXPECT_TRUE(torch::equal(all[k], all[0])) << "rank " << k;
  EXPECT_EQ(ring->connected(), w > 1);
}

TEST(SocketRing, SparseTensorsGiveWhatMpiGivesBitForBit) {
  // Mostly zero, as ReLU networks' gradients are, so that segments travel packed
  // (comm/ring/zero_frame.h), with zeros at other places on each rank, and signed zeros: -0.0 +
  // -0.0 is -0.0 and -0.0 + 0.0 is 0.0, which torch::equal cannot tell apart, so bytes are
  // compared.
  const int r = comm().rank();
  const auto ring = own_ring();
  auto bytes = [](const torch::Tensor& t) { return t.contiguous().view(torch::kByte); };
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kLong, torch::kByte}) {
    for (double density : {0.0, 0.02, 0.4}) {
      for (auto op : {ddp::ReduceOp::Sum, ddp::ReduceOp::Max}) {
        if (op == ddp::ReduceOp::Max && dtype == torch::kBFloat16) continue;
        const int64_t n = 200'003;
        torch::manual_seed(100 + r);
        const torch::Tensor kept = torch::rand({n}) < density;
        torch::Tensor values = (torch::randint(1, 5, {n}) * kept).to(dtype);
        if (torch::isFloatingType(dtype) && op == ddp::ReduceOp::Sum) {
          // Signed zeros where no value is kept, on every third element and on rank-dependent ones.
          const torch::Tensor negative = (torch::arange(n) % 3 == 0) | (torch::arange(n) % 5 == r);
          values = torch::where(kept | ~negative, values, torch::full({n}, -0.0, dtype));
        }
        torch::Tensor by_ring = values.clone(), by_mpi = values.clone();
        ring->all_reduce(by_ring, op);
        comm().all_reduce(by_mpi, op);
        EXPECT_TRUE(torch::equal(bytes(by_ring), bytes(by_mpi)))
            << dtype << ", density " << density << ", op " << static_cast<int>(op);
      }
    }
  }
}

TEST(SocketRing, BroadcastAllGatherAndBarrierGiveWhatMpiGives) {
  // Every root, a tensor of several 1 MiB pieces plus a partial one, an empty one, and a
  // gather of rows of every rank.
  const int r = comm().rank(), w = comm().size();
  const auto ring = own_ring();
  for (int root = 0; root < w; ++root) {
    for (int64_t n : {int64_t(0), int64_t(5), int64_t(700'001)}) {
      torch::Tensor by_ring = torch::arange(n, torch::kFloat) * (r + 1) + r;
      torch::Tensor by_mpi = by_ring.clone();
      ring->broadcast(by_ring, root);
      comm().broadcast(by_mpi, root);
      EXPECT_TRUE(torch::equal(by_ring, by_mpi)) << "root " << root << ", " << n << " elements";
    }
  }
  const torch::Tensor mine = torch::arange(6, torch::kLong).reshape({2, 3}) + 10 * r;
  EXPECT_TRUE(torch::equal(ring->all_gather(mine), comm().all_gather(mine)));
  ring->barrier();
  // The ring's checks are MPI's: a root out of range, an unsupported dtype.
  EXPECT_THROW(ring->broadcast(torch::zeros({2}), w), std::invalid_argument);
  EXPECT_THROW(ring->all_gather(torch::zeros({2}, torch::kShort)), std::invalid_argument);
  comm().barrier();
}

TEST(SocketRing, TakesCallsQueuedWhileOneRuns) {
  // DistributedDataParallel queues a bucket while the previous one is on the wire: the ring
  // takes it (only a call that failed half way makes it refuse the next at once). Each call
  // moves 64 MiB, so the first is on the wire when the next is queued 10 ms later.
  const int w = comm().size();
  const auto ring = own_ring();
  std::vector<torch::Tensor> tensors;
  std::vector<std::unique_ptr<ddp::Work>> pending;
  for (int i = 0; i < 3; ++i) {
    tensors.push_back(torch::full({16 << 20}, 1.0f + i));
    pending.push_back(ring->all_reduce_async(tensors.back()));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int i = 0; i < 3; ++i) {
    pending[i]->wait();
    EXPECT_TRUE(torch::equal(tensors[i], torch::full({16 << 20}, (1.0f + i) * w))) << i;
  }
}

TEST(SocketRing, ListensOnANamedInterface) {
  const auto ring = own_ring(MPI_COMM_WORLD, "ddp-no-such-interface,lo");  // the first present wins
  torch::Tensor t = torch::full({5000}, 1.0);
  ring->all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::full({5000}, double(comm().size()))));
}

TEST(SocketRing, NamesAMissingInterface) {
  if (comm().size() < 2) return;  // one rank never makes a ring
  const auto ring = own_ring(MPI_COMM_WORLD, "ddp-no-such-interface");
  std::string message;
  try {
    ring->all_reduce(torch::ones({10}));
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_NE(
      message.find("rank " + std::to_string(comm().rank()) +
                   ": DDP_SOCKET_IFNAME='ddp-no-such-interface' (CpuOptions::socket_interfaces): "
                   "no such interface up with an IPv4 address on this host (it has: lo 127.0.0.1"),
      std::string::npos)
      << message;
  EXPECT_FALSE(ring->connected());
}

TEST(SocketRing, NamesAPeerWhoseFrameIsNotOne) {
  // Rank 1 sends raw bytes where rank 0 expects a frame of 4 floats (as a peer of another ddp
  // version, without frames, would): rank 0 refuses them, naming rank 1, not a wrong sum.
  if (comm().size() < 2) return;
  const int r = comm().rank();
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r < 2 ? 0 : MPI_UNDEFINED, r, &pair);
  if (pair != MPI_COMM_NULL) {
    ddp::detail::RingConnections ring(pair, "", ddp::detail::single_host(pair));
    ring.set_call("all_reduce");
    const std::vector<float> values = {1, 2, 3, 4};
    if (r == 1) {
      const std::vector<unsigned char> raw(16, 0xff);
      ring.exchange(raw.data(), raw.size(), nullptr, 0);
    } else {
      std::vector<char> packed;
      std::vector<float> in(4);
      std::string message;
      try {
        ring.exchange_frame(ddp::detail::unpacked_frame(values.data(), 16), in.data(), 4, 4,
                            packed);
      } catch (const std::runtime_error& e) {
        message = e.what();
      }
      EXPECT_NE(message.find("rank 0: socket ring all_reduce: from rank 1 (127.0.0.1:"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("runs another version of ddp"), std::string::npos) << message;
    }
    MPI_Barrier(pair);  // rank 1's ring stays open until rank 0 has read
    MPI_Comm_free(&pair);
  }
  comm().barrier();
}

TEST(SocketRing, NamesAPeerThatLeft) {
  // Ranks 0 and 1 make a ring; in the next all-reduce, after the ranks agreed on it, rank 1
  // leaves and closes the ring (as its process would by ending): rank 0's all-reduce must fail at
  // once, naming rank 1, instead of waiting.
  if (comm().size() < 2) return;
  const int r = comm().rank();
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r < 2 ? 0 : MPI_UNDEFINED, r, &pair);
  if (pair != MPI_COMM_NULL) {
    auto ring = own_ring(pair);
    torch::Tensor t = torch::ones({1000});
    ring->all_reduce(t);  // makes the ring
    EXPECT_TRUE(torch::equal(t, torch::full({1000}, 2.0)));
    if (r == 1) {
      // The fill runs on the worker once the ranks have agreed on the call, before its bytes.
      auto leaving = ring->all_reduce_after_fill(torch::ones({1'000'000}),
                                                 [] { throw std::runtime_error("rank 1 leaves"); });
      EXPECT_THROW(leaving->wait(), std::runtime_error);
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
      EXPECT_NE(message.find("that rank has ended or lost the network"), std::string::npos)
          << message;
      // Bytes of the failed call may still be in flight: the ring refuses to go on.
      message.clear();
      try {
        ring->all_reduce(torch::ones({10}));
      } catch (const std::runtime_error& e) {
        message = e.what();
      }
      EXPECT_NE(message.find("an earlier all_reduce failed half way"), std::string::npos)
          << message;
    }
    MPI_Comm_free(&pair);
  }
  comm().barrier();
}

// ProcessGroup's CPU communicator with the ring forced on (one host): all-reduces of 4 KiB or
// more take the ring.
ddp::CpuOptions routed_options() {
  ddp::CpuOptions options;
  options.sockets = ddp::CpuOptions::Sockets::Always;
  options.socket_bytes = 4096;
  return options;
}

TEST(SizeRoutedCommunicator, SmallAllReducesOnMpiLargeOnesOnTheRing) {
  if (comm().size() < 2) return;  // one rank has no ring
  ddp::SizeRoutedCommunicator routed(MPI_COMM_WORLD, routed_options());
  const torch::Tensor small = torch::ones({1023}), large = torch::ones({1024});  // 4092, 4096 B
  EXPECT_EQ(&routed.route(small), static_cast<const ddp::Communicator*>(&routed.mpi()));
  EXPECT_EQ(&routed.route(large), static_cast<const ddp::Communicator*>(&routed.ring()));
  // The ring connects at the first large all-reduce only: the small ones never touched it.
  routed.all_reduce(small);
  routed.broadcast(small);
  EXPECT_FALSE(routed.ring().connected());
  routed.all_reduce(large);
  EXPECT_TRUE(routed.ring().connected());
  EXPECT_TRUE(torch::equal(large, torch::full({1024}, double(comm().size()))));
  // Checked as MPI checks it, whichever path it would take.
  try {
    routed.all_reduce(torch::ones({4096}, torch::kInt), ddp::ReduceOp::Avg);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "MpiCommunicator::all_reduce: Avg needs a floating-point tensor, got int32");
  }
}

TEST(SizeRoutedCommunicator, InterleavedSizesGiveMpisResultsInCallOrder) {
  // Small and large all-reduces interleaved, both orders, all in flight at once, then a
  // blocking call: every result is MPI's (exact values), and the calls ran one at a time in the
  // order they were made (each finished before the next began), the blocking one last.
  const int r = comm().rank();
  ddp::SizeRoutedCommunicator routed(MPI_COMM_WORLD, routed_options());
  const std::vector<int64_t> sizes{10, 5000, 7, 100'000, 100'000, 3, 2000, 64'000};
  std::vector<torch::Tensor> by_routed, by_mpi;
  std::vector<std::unique_ptr<ddp::Work>> works;
  for (size_t i = 0; i < sizes.size(); ++i) {
    by_routed.push_back(torch::arange(sizes[i], torch::kFloat).remainder(11) * (r + 1) + i);
    by_mpi.push_back(by_routed.back().clone());
    works.push_back(
        routed.all_reduce_async(by_routed.back(), i % 3 ? ddp::ReduceOp::Sum : ddp::ReduceOp::Max));
  }
  torch::Tensor last = torch::full({2}, double(r));
  routed.all_reduce(last, ddp::ReduceOp::Max);  // blocking, small: on MPI, after every ring call
  std::optional<ddp::Work::Span> before;
  for (size_t i = 0; i < works.size(); ++i) {
    const auto span = works[i]->host_span();
    ASSERT_TRUE(span.has_value()) << "call " << i << " unfinished after a later blocking call";
    if (before) {
      EXPECT_LE(before->end, span->start) << "call " << i << " overlapped the one before";
    }
    before = span;
    works[i]->wait();
    comm().all_reduce(by_mpi[i], i % 3 ? ddp::ReduceOp::Sum : ddp::ReduceOp::Max);
    EXPECT_TRUE(torch::equal(by_routed[i], by_mpi[i]))
        << "call " << i << ", " << sizes[i] << " elements";
  }
  EXPECT_TRUE(torch::equal(last, torch::full({2}, double(comm().size() - 1))));
  EXPECT_EQ(routed.ring().connected(), comm().size() > 1);
}

TEST(CpuCommunicator, AllReduceAfterFillFillsOnTheWorkerInCallOrder) {
  ddp_test::check_all_reduce_after_fill(comm(), 10, /*on_worker=*/true, "ProcessGroup::cpu()");
  const auto ring = own_ring();
  ddp_test::check_all_reduce_after_fill(*ring, 1000, true, "SocketRing");
  ddp::SizeRoutedCommunicator routed(MPI_COMM_WORLD, routed_options());
  ddp_test::check_all_reduce_after_fill(routed, 10, true, "SizeRoutedCommunicator, on MPI");
  ddp_test::check_all_reduce_after_fill(routed, 5000, true, "SizeRoutedCommunicator, on the ring");
  ddp_test::check_all_reduce_after_fill(routed, 5000, true, "SizeRoutedCommunicator, MPI then ring",
                                        /*first_n=*/10);
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
  for (int r = 0; r < comm().size(); ++r)
    EXPECT_TRUE(torch::equal(all[r], torch::full({3}, r, torch::kLong)));
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

// The description every backend checks and names its calls with (comm/collective.h).
TEST(Collective, NamesACallAsErrorsAndFingerprintsDo) {
  using ddp::detail::Collective;
  const auto rules = ddp::detail::host_rules("MpiCommunicator::");
  Collective reduce = Collective::all_reduce(rules, torch::zeros({10}), ddp::ReduceOp::Sum);
  reduce.seq = 12;
  EXPECT_EQ(reduce.describe(), "all_reduce #12 float32[10] (sum)");
  Collective root = Collective::broadcast(rules, torch::zeros({2, 3}, torch::kLong), 1, 2);
  root.seq = 3;
  EXPECT_EQ(root.describe(), "broadcast #3 int64[2,3] (root 1)");
  Collective gather =
      Collective::all_gather(rules, torch::zeros({1, 2, 3, 4, 5, 6, 7}, torch::kDouble));
  gather.seq = 4;
  EXPECT_EQ(gather.describe(), "all_gather #4 float64[1,2,3,4,5,6,...]");
  Collective wait = Collective::barrier();
  wait.seq = 5;
  EXPECT_EQ(wait.describe(), "barrier #5");
  // A fingerprint names the call as the call does, and tells apart what differs.
  EXPECT_EQ(Collective::describe(reduce.fingerprint()), reduce.describe());
  Collective max = Collective::all_reduce(rules, torch::zeros({10}), ddp::ReduceOp::Max);
  max.seq = 12;
  Collective longer = Collective::all_reduce(rules, torch::zeros({11}), ddp::ReduceOp::Sum);
  longer.seq = 12;
  Collective same = Collective::all_reduce(rules, torch::ones({10}), ddp::ReduceOp::Sum);
  same.seq = 12;
  EXPECT_NE(reduce.fingerprint(), max.fingerprint());
  EXPECT_NE(reduce.fingerprint(), longer.fingerprint());
  EXPECT_EQ(reduce.fingerprint(), same.fingerprint());
}

TEST(Collective, ChecksTheArgumentsAgainstTheBackendsRules) {
  using ddp::ReduceOp;
  using ddp::detail::Collective;
  auto error = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto host = ddp::detail::host_rules("MpiCommunicator::");
  EXPECT_EQ(error([&] { Collective::all_reduce(host, torch::Tensor(), ReduceOp::Sum); }),
            "MpiCommunicator::all_reduce: undefined tensor");
  EXPECT_EQ(error([&] {
              Collective::all_reduce(host, torch::zeros({3, 4}).t(), ReduceOp::Sum);
            }),
            "MpiCommunicator::all_reduce: tensor must be contiguous");
  EXPECT_EQ(error([&] { Collective::broadcast(host, torch::zeros({2}, torch::kShort), 0, 2); }),
            "MpiCommunicator::broadcast: unsupported dtype int16 (float32, float64, float16, "
            "bfloat16, int32, int64, uint8)");
  EXPECT_EQ(
      error([&] { Collective::all_reduce(host, torch::zeros({2}, torch::kInt), ReduceOp::Avg); }),
      "MpiCommunicator::all_reduce: Avg needs a floating-point tensor, got int32");
  EXPECT_EQ(
      error([&] { Collective::all_reduce(host, torch::zeros({2}, torch::kHalf), ReduceOp::Max); }),
      "MpiCommunicator::all_reduce: float16/bfloat16 support Sum and Avg only");
  EXPECT_EQ(error([&] { Collective::broadcast(host, torch::zeros({2}), 2, 2); }),
            "MpiCommunicator::broadcast: root 2 is not a rank of 2");
  EXPECT_EQ(error([&] { Collective::broadcast(host, torch::zeros({2}), -1, 2); }),
            "MpiCommunicator::broadcast: root -1 is not a rank of 2");
  EXPECT_EQ(
      error([&] { Collective::all_reduce(host, torch::zeros({2}, torch::kHalf), ReduceOp::Avg); }),
      "no error");
  EXPECT_EQ(error([&] { Collective::all_gather(host, torch::zeros({2}, torch::kByte)); }),
            "no error");

  // A backend bound to a device, taking any dtype.
  ddp::detail::Rules cpu_only;
  cpu_only.prefix = "cpu backend: ";
  cpu_only.device = torch::Device(torch::kCPU);
  cpu_only.device_reason = "it reduces CPU tensors";
  const torch::Tensor elsewhere = torch::zeros({2}, torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(error([&] { Collective::all_gather(cpu_only, elsewhere); }),
            "cpu backend: all_gather: the tensor is on meta, but it reduces CPU tensors");
  EXPECT_EQ(error([&] {
              Collective::all_reduce(cpu_only, torch::zeros({2}, torch::kShort), ReduceOp::Max);
            }),
            "no error");
}

TEST(Collective, AvgIsASumDividedByTheSize) {
  EXPECT_EQ(ddp::detail::without_avg(ddp::ReduceOp::Avg), ddp::ReduceOp::Sum);
  EXPECT_EQ(ddp::detail::without_avg(ddp::ReduceOp::Max), ddp::ReduceOp::Max);
  torch::Tensor summed = torch::full({3}, 6.0), maxed = summed.clone();
  ddp::detail::finish_avg(summed, ddp::ReduceOp::Avg, 4);
  ddp::detail::finish_avg(maxed, ddp::ReduceOp::Max, 4);
  EXPECT_TRUE(torch::equal(summed, torch::full({3}, 1.5)));
  EXPECT_TRUE(torch::equal(maxed, torch::full({3}, 6.0)));
}

// The Inquiry (comm/mpi/inquiry.h) numbers its questions: a rank busy outside collectives answers a
// question only when it next waits in one, after the asker gave up, and that late answer must
// not pass for its answer to a later question (it reported a call finished long ago, and two
// such answers ended a healthy job as "the ranks call different collectives"). Rank 1 asks; the
// others answer at once, except rank 0, which answers only where this test says.
TEST(Inquiry, ALateAnswerIsNotTakenForTheAnswerToALaterQuestion) {
  if (ddp_test::runtime().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  using namespace std::chrono_literals;
  const int rank = ddp_test::runtime().rank();
  ddp::detail::Inquiry inquiry(MPI_COMM_WORLD);
  inquiry.join("test", [] {
    ddp::detail::CallReport call;
    call.in_collective = true;
    call.seq = 7;
    return call;
  });
  auto answer_for = [&](std::chrono::milliseconds span) {
    for (const auto until = std::chrono::steady_clock::now() + span;
         std::chrono::steady_clock::now() < until;) {
      inquiry.answer();
      std::this_thread::sleep_for(5ms);
    }
  };
  auto phase = [&](bool rank0_answers, const std::function<void()>& ask) {
    if (rank == 1)
      ask();
    else if (rank == 0 && !rank0_answers)
      std::this_thread::sleep_for(300ms);
    else
      answer_for(rank == 0 ? 1000ms : 700ms);
    ddp_test::group().cpu().barrier();
  };
  // 1. Rank 0 is busy: no answer.
  phase(false, [&] { EXPECT_FALSE(inquiry.ask(200ms)[0].answered); });
  // 2. Rank 0 answers that question now, late.
  phase(true, [] {});
  // 3. Rank 0 is busy again: its late answer is not this question's.
  phase(false, [&] { EXPECT_FALSE(inquiry.ask(200ms)[0].answered) << "a late answer was taken"; });
  // 4. Rank 0 answers (question 2's late answer first): this question's answer counts.
  phase(true, [&] {
    const auto reports = inquiry.ask(2000ms);
    ASSERT_TRUE(reports[0].answered);
    ASSERT_EQ(reports[0].calls.size(), 1u);
    EXPECT_EQ(reports[0].calls[0].seq, 7);
  });
}

}  // namespace test_communicator

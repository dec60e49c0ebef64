// Communicator::reduce_scatter and all_gather_into (the flat collectives of ZeRO-1) on MPI, the
// TCP ring, the CPU communicator routed to the ring, and the base class's fallback: exact values
// at every rank count the binary runs with (ctest: 1, 2 and 4). And the base class's
// all_reduce_after_fill.
#include <ddp/communicator.h>
#include "comm/compose/cpu_communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/ring/socket_ring.h"
#include "runtime/runtime_internals.h"

#include "fill_check.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace test_flat_collectives {

MPI_Comm world() { return ddp::detail::RuntimeInternals::comm(ddp_test::runtime()); }

// Only the four required calls, forwarded to MPI: reduce_scatter and all_gather_into are the
// base class's (all_reduce and all_gather), as for a communicator that has no native ones.
class Fallback final : public ddp::Communicator {
 public:
  Fallback() : mpi_(world()) {}
  std::string backend() const override { return "fallback"; }
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  std::unique_ptr<ddp::Work> all_reduce_async(const torch::Tensor& t, ddp::ReduceOp op) override {
    return mpi_.all_reduce_async(t, op);
  }
  void broadcast(const torch::Tensor& t, int root) override { mpi_.broadcast(t, root); }
  torch::Tensor all_gather(const torch::Tensor& t) override { return mpi_.all_gather(t); }
  void barrier() override { mpi_.barrier(); }

 private:
  ddp::MpiCommunicator mpi_;
};

// Rank k's value at element j of a flat buffer: small integers, exact in every dtype.
torch::Tensor values(int k, int64_t n, torch::Dtype dtype) {
  return ((torch::arange(n, torch::kLong) * (k + 3) + 7 * k) % 23 - 5).to(dtype);
}

torch::Tensor expected_reduction(int ranks, int64_t n, torch::Dtype dtype, ddp::ReduceOp op) {
  torch::Tensor acc = values(0, n, torch::kDouble);
  for (int k = 1; k < ranks; ++k) {
    const torch::Tensor v = values(k, n, torch::kDouble);
    switch (op) {
      case ddp::ReduceOp::Sum:
      case ddp::ReduceOp::Avg:
        acc = acc + v;
        break;
      case ddp::ReduceOp::Min:
        acc = torch::minimum(acc, v);
        break;
      case ddp::ReduceOp::Max:
        acc = torch::maximum(acc, v);
        break;
    }
  }
  if (op == ddp::ReduceOp::Avg) acc = acc / ranks;  // 1, 2 or 4 ranks: exact
  return acc.to(dtype);
}

void check_flat_collectives(ddp::Communicator& comm) {
  const int w = comm.size(), r = comm.rank();
  const std::string name = comm.backend();
  for (int64_t n : {1, 3, 1000, 70000}) {  // 70000 floats per rank: past the ring's routing size
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kInt, torch::kLong}) {
      for (auto op :
           {ddp::ReduceOp::Sum, ddp::ReduceOp::Avg, ddp::ReduceOp::Min, ddp::ReduceOp::Max}) {
        if (op == ddp::ReduceOp::Avg && !c10::isFloatingType(dtype)) continue;
        const torch::Tensor input = values(r, n * w, dtype), kept = input.clone();
        torch::Tensor output = torch::full({n}, 99, dtype);
        comm.reduce_scatter(output, input, op);
        const torch::Tensor all = expected_reduction(w, n * w, dtype, op);
        EXPECT_TRUE(torch::equal(output, all.slice(0, r * n, (r + 1) * n)))
            << name << " reduce_scatter " << n << " x " << dtype << " op " << static_cast<int>(op);
        EXPECT_TRUE(torch::equal(input, kept)) << name << ": reduce_scatter changed its input";
      }
      const torch::Tensor mine = values(r, n, dtype);
      torch::Tensor gathered = torch::full({n * w}, 99, dtype);
      comm.all_gather_into(gathered, mine);
      for (int k = 0; k < w; ++k) {
        EXPECT_TRUE(torch::equal(gathered.slice(0, k * n, (k + 1) * n), values(k, n, dtype)))
            << name << " all_gather_into " << n << " x " << dtype << ", chunk " << k;
      }
    }
  }
  // 16-bit floats are summed in float and rounded per element; these sums are exact.
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    torch::Tensor output = torch::empty({5}, dtype);
    comm.reduce_scatter(output, values(r, 5 * w, dtype), ddp::ReduceOp::Sum);
    EXPECT_TRUE(torch::equal(
        output,
        expected_reduction(w, 5 * w, dtype, ddp::ReduceOp::Sum).slice(0, r * 5, (r + 1) * 5)))
        << name << " " << dtype;
  }
  // A contiguous tensor of any shape is a flat buffer: rows of [ranks, 3] are the chunks.
  torch::Tensor rows = torch::empty({w, 3});
  comm.all_gather_into(rows, values(r, 3, torch::kFloat));
  for (int k = 0; k < w; ++k)
    EXPECT_TRUE(torch::equal(rows[k], values(k, 3, torch::kFloat))) << name;
  // Sizes that do not divide are refused, naming the padding.
  try {
    comm.reduce_scatter(torch::empty({2}), torch::zeros({2 * w + 1}));
    ADD_FAILURE() << name << ": an uneven reduce_scatter was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pad it to a multiple of the ranks"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm.all_gather_into(torch::empty({w * 2}, torch::kDouble), torch::zeros({2})),
               std::invalid_argument);
  const torch::Tensor same = torch::zeros({w});
  if (w == 1) {
    EXPECT_THROW(comm.reduce_scatter(same, same), std::invalid_argument);
  }
}

TEST(FlatCollectives, Mpi) { check_flat_collectives(ddp_test::group().cpu()); }

TEST(FlatCollectives, SocketRing) {
  ddp::SocketRing ring(world(), ddp::SocketRingOptions{});
  check_flat_collectives(ring);
  EXPECT_EQ(ring.connected(), ring.size() > 1);
}

TEST(FlatCollectives, CpuCommunicatorRoutesLargeOnesToTheRing) {
  ddp::CpuOptions options;
  options.sockets = ddp::CpuOptions::Sockets::Always;
  const auto comm = ddp::make_cpu_communicator(world(), options);
  check_flat_collectives(*comm);
  if (auto* routed = dynamic_cast<ddp::SizeRoutedCommunicator*>(comm.get())) {
    EXPECT_TRUE(routed->ring().connected());  // the 70000-element calls took it
  } else {
    EXPECT_EQ(comm->size(), 1);  // one rank never makes a ring
  }
}

TEST(FlatCollectives, BaseClassFallback) {
  Fallback comm;
  check_flat_collectives(comm);
  // all_reduce_after_fill's default: the fill at the call, then all_reduce_async.
  ddp_test::check_all_reduce_after_fill(comm, 10, /*on_worker=*/false, "the base class");
}

}  // namespace test_flat_collectives

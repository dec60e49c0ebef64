#pragma once
// ProcessGroup's communicator for CPU tensors, made by make_cpu_communicator(): the MPI backend,
// with the all-reduces of at least CpuOptions::socket_bytes on ddp's TCP ring
// (comm/ring/socket_ring.h) where CpuOptions::sockets says, or a HierarchicalCommunicator where
// CpuOptions::hierarchical says (its leaders take the ring between hosts by the same policy).
//
// Why: Open MPI's TCP transport moves bytes only while a thread polls inside an MPI call, so
// beside training it runs at the speed that thread gets a core; on the ring the worker sleeps in
// poll() while the kernel moves the bytes. The ring's result is the same on every rank but may
// differ in the last bits from MPI's. The other collectives and small all-reduces stay on MPI,
// whose latency is lower.
//
// Where (agreed by every rank): Auto when the ranks span several hosts and none has an
// InfiniBand/RoCE or Slingshot device (where MPI beats TCP); Never; Always (loopback too); never
// with one rank. The ring connects at the first large all-reduce (collective); rank 0 says so once.
//
// Order: the ring runs on the MPI communicator's worker, not a thread of its own, so every call
// of this communicator runs one at a time in call order whichever path it takes (communicator.h),
// and the watchdog and the debug mode number and check both paths as one. The price: a ring
// all-reduce and an MPI call of this communicator never overlap.

#include "comm/mpi/mpi_communicator.h"
#include "comm/ring/socket_ring.h"

#include <ddp/communicator.h>

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

struct CpuOptions {
  MpiOptions mpi;
  // Where the large all-reduces take the ring (above).
  enum class Sockets { Auto, Never, Always };
  Sockets sockets = Sockets::Auto;
  // All-reduces of at least this many bytes take the ring; smaller ones stay on MPI.
  std::size_t socket_bytes = 64 << 10;
  // The interfaces the ring listens on (SocketRingOptions::interfaces).
  std::string socket_interfaces;
  // Whether the all-reduces go through one leader per host (hierarchical_communicator.h).
  HierarchicalAllReduce hierarchical = HierarchicalAllReduce::Auto;
  // Tests: ranks per "host", in rank order, instead of the ranks that share memory (empty: the
  // real hosts).
  std::vector<int> host_split;
};

// CpuOptions::sockets by name: "auto", "never", "always" (DDP_MPI_SOCKETS, benchmark flags);
// any other name throws std::invalid_argument naming `what` and the names.
CpuOptions::Sockets parse_sockets(const std::string& name, const std::string& what);
const char* to_string(CpuOptions::Sockets sockets);

// Whether the ring is wanted over `comm` (the policy above; the same answer on every rank).
// Collective.
bool socket_ring_wanted(MPI_Comm comm, CpuOptions::Sockets sockets);

// A HierarchicalCommunicator where CpuOptions::hierarchical says so for the hosts of `comm`
// (comm/compose/hierarchical_communicator.h); else an MpiCommunicator over `comm`, or, where
// socket_ring_wanted(), a SizeRoutedCommunicator. Collective.
std::unique_ptr<Communicator> make_cpu_communicator(MPI_Comm comm, CpuOptions options);

// MPI, with the all-reduces of at least CpuOptions::socket_bytes on the TCP ring (above).
class SizeRoutedCommunicator final : public Communicator {
 public:
  // Collective over `comm` (the MPI communicator's duplicates; the ring connects later).
  SizeRoutedCommunicator(MPI_Comm comm, CpuOptions options);
  ~SizeRoutedCommunicator() override;

  // "mpi": it is the MPI backend, with a faster path for large all-reduces.
  std::string backend() const override { return mpi_.backend(); }
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }

  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                         ReduceOp op = ReduceOp::Sum) override {
    return all_reduce_after_fill(tensor, {}, op);
  }
  std::unique_ptr<Work> all_reduce_after_fill(const torch::Tensor& tensor,
                                              std::function<void()> fill,
                                              ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const torch::Tensor& tensor, int root = 0) override {
    mpi_.broadcast(tensor, root);
  }
  torch::Tensor all_gather(const torch::Tensor& tensor) override { return mpi_.all_gather(tensor); }
  // As all-reduces: on the ring when `input` (reduce_scatter) or `output` (all_gather_into) has
  // socket_bytes or more.
  void reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                      ReduceOp op = ReduceOp::Sum) override;
  void all_gather_into(const torch::Tensor& output, const torch::Tensor& input) override;
  void barrier() override { mpi_.barrier(); }

  // Where an all-reduce of `tensor` goes: the ring when it has socket_bytes or more.
  Communicator& route(const torch::Tensor& tensor);
  const MpiCommunicator& mpi() const { return mpi_; }
  const SocketRing& ring() const { return ring_; }

 private:
  std::size_t socket_bytes_;
  MpiCommunicator mpi_;  // owns the worker that ring_ shares: declared first, destroyed last
  SocketRing ring_;
};

}  // namespace ddp

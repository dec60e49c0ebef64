#pragma once
// ProcessGroup's communicator for CPU tensors: the MPI backend (comm/mpi/mpi_communicator.h), and,
// where CpuOptions::sockets says, ddp's TCP ring (comm/ring/socket_ring.h) for the all-reduces of
// at least CpuOptions::socket_bytes. make_cpu_communicator() decides; ProcessGroup's communicators
// are made by it (parallel/backend_options.h).
//
// Why: Open MPI's TCP transport moves bytes only while a thread polls it inside an MPI call, so
// between hosts linked by TCP its all-reduce runs at the speed the polling thread gets a core
// beside training, and from 64 KiB it takes its blocking path (mpi_communicator.h); on the ring
// the worker sleeps in poll() while the kernel moves the bytes (bench/analysis.md). The ring's
// result is bitwise the same on every rank, but may differ in the last bits from MPI's (another
// order of additions). The other collectives, and the all-reduces under 64 KiB (agreed flags,
// small buckets), stay on MPI, whose latency is lower.
//
// Where (CpuOptions::sockets, agreed by every rank when the communicator is made): Auto when the
// ranks span more than one host and no rank has an InfiniBand/RoCE or Slingshot device (where MPI
// has a faster transport than TCP); Never; Always (on one host too, over loopback). With one rank,
// never. Without the ring, make_cpu_communicator() returns the MpiCommunicator itself.
//
// Hierarchy (CpuOptions::hierarchical): with several hosts and several ranks on some host,
// make_cpu_communicator() returns a HierarchicalCommunicator instead (reduce on each host,
// all-reduce among one leader per host, broadcast on each host:
// comm/compose/hierarchical_communicator.h), whose leaders take the ring between hosts by the
// policy above, applied to the leaders.
//
// The ring connects at the first large all-reduce (collective, on the worker), and rank 0 then
// prints once: "ddp: socket ring: all-reduces of 64 KiB or more go over TCP between the N ranks
// (rank 0 at a.b.c.d:port; DDP_MPI_SOCKETS=never keeps them on MPI)".
//
// Order (communicator.h: the collectives of one communicator run in call order; a blocking call
// issued after asynchronous ones runs after them): the ring does not get a worker thread of its
// own; it runs on the MPI communicator's (SocketRing's shared-worker constructor), which makes
// every call of this communicator, one at a time, in the order they were made, whichever path
// each takes. So the contract holds exactly as for MPI alone, and besides: the sequence numbers
// of the watchdog's and the debug mode's messages count both paths, the watchdog covers a hung
// ring call as a hung MPI one, and the debug mode checks the ring's calls too. Two workers would
// break it: a small all-reduce queued after a large one could finish before it, a barrier would
// no longer wait for the ring's all-reduces issued before it, and each path would number and
// check its calls apart. The price, as before the ring was a communicator of its own: a ring
// all-reduce and an MPI call of this communicator never overlap (those of two communicators do).

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
  // Where the large all-reduces take the ring (above). ProcessGroup reads DDP_MPI_SOCKETS.
  enum class Sockets { Auto, Never, Always };
  Sockets sockets = Sockets::Auto;
  // All-reduces of at least this many bytes take the ring; smaller ones stay on MPI.
  // ProcessGroup reads DDP_MPI_SOCKET_KIB.
  std::size_t socket_bytes = 64 << 10;
  // The interfaces the ring listens on (SocketRingOptions::interfaces). ProcessGroup reads
  // DDP_SOCKET_IFNAME (`ddprun --iface` sets it).
  std::string socket_interfaces;
  // Whether the all-reduces go through one leader per host
  // (comm/compose/hierarchical_communicator.h). ProcessGroup sets it from
  // ProcessGroupOptions::hierarchical.
  HierarchicalAllReduce hierarchical = HierarchicalAllReduce::Auto;
  // Tests: ranks per "host", in rank order, instead of the ranks that share memory (empty: the
  // real hosts). ProcessGroup takes it from testing::hooks() (util/testing_hooks.h).
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

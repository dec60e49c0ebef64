#pragma once
// Hierarchical all-reduce (internal; not installed): ProcessGroup's communicator for CPU tensors
// when the ranks span several hosts and some host has several ranks
// (comm/compose/cpu_communicator.h decides). Each all-reduce is made in three phases:
//   1. reduce on each host: each rank sends its tensor to the host's leader (its lowest rank),
//      which combines them in host-rank order (MPI point to point on a communicator of the
//      host's ranks; Open MPI: shared memory);
//   2. all-reduce among the leaders, one per host, over the transport the flat all-reduce takes
//      between hosts: ddp's TCP ring (comm/ring/socket_ring.h) for all-reduces of at least
//      CpuOptions::socket_bytes where socket_ring_wanted() says so over the leaders, else MPI;
//   3. broadcast on each host: the leader sends the result to each of its host's ranks.
// Avg is summed in every phase and divided by size() on the leader, before the broadcast.
// Why point to point on the host, not MPI_Reduce and MPI_Bcast: one message per rank, which
// shared memory moves in a single copy, waited for asleep by the worker (as a ring wait). Open
// MPI's non-blocking collectives progress only while the worker tests them, so the worker's sleeps
// between tests slow them, and its blocking ones busy-wait in segments, taking a shared core.
//
// Why: a flat ring over N ranks sends 2(N-1)/N of the tensor from every rank, and with several
// ranks per host several of those hops cross the link between hosts: 4 ranks on 2 hosts put
// 1.5x the tensor on the link each way, where the leaders' ring of 2 puts 1x (2(H-1)/H with H
// hosts). Inside a host the bytes move through memory, at a cost the link makes negligible.
//
// Invariants: every rank ends with its leader's bytes, and the leaders with bitwise the same
// result (MPI's all-reduce and the ring give every rank the same bytes), so all ranks hold
// bitwise the same result. It equals the flat all-reduce up to the order of the additions
// (floating point: within rounding; integers, Min and Max: exactly).
//
// Hosts: the ranks that share memory (MPI_COMM_TYPE_SHARED, as the Runtime's nodes), or, for
// tests, CpuOptions::host_split ({2, 2}: ranks 0-1 are one "host", ranks 2-3
// another, on one machine). Hosts may have different numbers of ranks, and a host's ranks need
// not be consecutive: each phase is over the ranks that are there (a host of one rank has
// nothing to reduce or broadcast).
//
// Threads and order (communicator.h's contract): as SizeRoutedCommunicator, every call runs on
// the worker of one MPI communicator over all ranks (comm/mpi/mpi_worker.h), one at a time in call
// order, and the three phases are one queued collective: the watchdog (over every rank) covers
// it as one collective and names the ranks that never arrived, the debug mode checks it. The
// other collectives (broadcast, all_gather, barrier) are that MPI communicator's. Waiting: the
// ranks that are not leaders sleep in their receive (the worker's spin, then sleeps) while their
// leader talks to the other hosts. The leaders' MPI all-reduces of at least
// MpiOptions::blocking_bytes first wait in an MPI_Ibarrier and then make the blocking call, as
// MpiCommunicator does.
//
// Errors: the MPI backend's checks and messages ("MpiCommunicator::all_reduce: ..."), whichever
// path a call takes; a leaders' ring call that failed half way makes the later ones refuse, as
// the ring does. Bad CpuOptions::host_split: std::invalid_argument naming it.

#include "comm/compose/cpu_communicator.h"
#include "comm/mpi/mpi_communicator.h"

#include <ddp/communicator.h>

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

namespace detail {
// Each rank's host, named by the lowest rank on it, in rank order: from `host_split` (ranks per
// host, in rank order; must add up to the size of `comm`) or, when it is empty, from the ranks
// that share memory. Collective over `comm`.
std::vector<int> host_of_each_rank(MPI_Comm comm, const std::vector<int>& host_split);
}  // namespace detail

// Whether the all-reduces of a communicator over `comm` go through one leader per host
// (CpuOptions::hierarchical): Auto when there are several hosts and some host has several
// ranks, On always (with one rank, never), Off never. `hosts`: detail::host_of_each_rank().
bool hierarchical_wanted(HierarchicalAllReduce mode, const std::vector<int>& hosts);

class HierarchicalCommunicator final : public Communicator {
 public:
  // Collective over `comm`. `hosts`: detail::host_of_each_rank(comm, options.host_split).
  HierarchicalCommunicator(MPI_Comm comm, CpuOptions options, std::vector<int> hosts);
  ~HierarchicalCommunicator() override;
  HierarchicalCommunicator(const HierarchicalCommunicator&) = delete;
  HierarchicalCommunicator& operator=(const HierarchicalCommunicator&) = delete;

  std::string backend() const override { return "mpi-hierarchical"; }
  int rank() const override { return flat_.rank(); }
  int size() const override { return flat_.size(); }

  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                         ReduceOp op = ReduceOp::Sum) override {
    return all_reduce_after_fill(tensor, {}, op);
  }
  std::unique_ptr<Work> all_reduce_after_fill(const torch::Tensor& tensor,
                                              std::function<void()> fill,
                                              ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const torch::Tensor& tensor, int root = 0) override {
    flat_.broadcast(tensor, root);
  }
  torch::Tensor all_gather(const torch::Tensor& tensor) override {
    return flat_.all_gather(tensor);
  }
  void barrier() override { flat_.barrier(); }

  int hosts() const;              // the number of hosts (leaders)
  bool leader() const;            // whether this rank is its host's leader
  bool leaders_use_ring() const;  // whether the leaders' large all-reduces take the TCP ring

  struct State;  // the host's and the leaders' communicators, the ring (worker thread only)

 private:
  std::unique_ptr<State> state_;  // used by the queued calls: declared first, destroyed last
  MpiCommunicator flat_;          // owns the worker every call runs on
};

}  // namespace ddp

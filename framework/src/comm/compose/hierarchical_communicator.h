#pragma once
// Hierarchical all-reduce: ProcessGroup's communicator for CPU tensors when the ranks span
// several hosts and some host has several ranks (cpu_communicator.h decides). Three phases:
//   1. reduce on each host to its leader (its lowest rank), in host-rank order;
//   2. all-reduce among the leaders, over the TCP ring (socket_ring.h) where socket_ring_wanted()
//      says so over the leaders and the tensor has CpuOptions::socket_bytes, else MPI;
//   3. broadcast on each host from the leader.
// Avg is summed in every phase and divided by size() on the leader before the broadcast. On a
// host, point to point rather than MPI_Reduce/MPI_Bcast: one message per rank in shared memory,
// waited for asleep by the worker, where Open MPI's collectives need polling or busy-wait.
//
// Why: a flat ring over N ranks sends 2(N-1)/N of the tensor from every rank, and with several
// ranks per host several of those hops cross the link between hosts; the leaders' ring puts
// 2(H-1)/H on it with H hosts. Inside a host the bytes move through memory.
//
// Invariants: all ranks hold bitwise the same result (their leader's, which the leaders share),
// equal to the flat all-reduce up to the order of the additions.
//
// Hosts: the ranks that share memory, or CpuOptions::host_split for tests ({2, 2}: ranks 0-1 one
// "host", 2-3 another). Hosts may differ in size and need not be consecutive ranks.
//
// Order (communicator.h): as SizeRoutedCommunicator, every call runs on one MPI communicator's
// worker over all ranks, and the three phases are one queued collective, which the watchdog and
// the debug mode see as one. The other collectives are that MPI communicator's.
//
// Errors: the MPI backend's checks and messages whichever path a call takes; a leaders' ring call
// that failed half way makes later ones refuse. A bad host_split: std::invalid_argument naming it.

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

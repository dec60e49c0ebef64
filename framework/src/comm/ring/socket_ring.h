#pragma once
// ddp's TCP ring: a Communicator for CPU tensors over plain sockets between the ranks. The CPU
// communicator sends its large all-reduces here between hosts linked by TCP (cpu_communicator.h
// says why and where); it also works alone (tests, benchmarks).
//
// The all-reduce is the ring of reduce-scatter then all-gather (as gloo's and NCCL's): each rank
// sends and receives 2(n-1)/n of the tensor, less its zero elements where a frame that leaves
// them out is shorter (zero_frame.h; lossless), unless the link is fast (RingBuffers::fast_link).
// Every element is reduced in the same order on every rank, so all ranks hold bitwise the same
// result, run after run; 16-bit floats are added in float and rounded per element, as on MPI.
// reduce_scatter and all_gather_into are the two phases alone (rank r ends with segment r);
// broadcast passes the root's tensor along in 1 MiB pieces; barrier is a one-byte all-reduce.
//
// Threads and order: the calls run on an MpiWorker (mpi_worker.h), one at a time in call order,
// under its watchdog and debug-mode check; alone the ring has a worker of its own, in the CPU
// communicator it shares the MPI one's. Checks and dtypes: the MPI backend's (host_rules).
//
// Connections (ring_connections.h) are made by the first collective, collectively on the worker;
// a failed attempt leaves none, and the next call tries again.
//
// Errors: std::runtime_error naming this rank, the peer rank and its address. After a collective
// that failed half way the ring refuses further calls at once (bytes of it may still be on the
// wire).

#include "comm/collective.h"
#include "comm/mpi/mpi_worker.h"

#include <ddp/communicator.h>

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

namespace detail {
class RingConnections;
// The ring's all-reduce, in place on the calling thread over connected `ring` (the hierarchical
// all-reduce's leaders use it too: comm/compose/hierarchical_communicator.h). `tensor` contiguous
// on the CPU; `buffers` are reused between calls. Avg is left to the caller (finish_avg).
struct RingBuffers {
  torch::Tensor scratch;             // the received segment, before it is reduced in
  std::vector<char> sent, received;  // frames (comm/ring/zero_frame.h)
  // Whether the last exchange of 1 MiB or more moved 4 Gbit/s or more: then segments go as they
  // are, since on such a link packing a sparse segment costs more than the bytes it saves.
  bool fast_link = false;
};
void ring_all_reduce(RingConnections& ring, RingBuffers& buffers, const torch::Tensor& tensor,
                     ReduceOp op);
}  // namespace detail

struct SocketRingOptions : WorkerOptions {
  // The interfaces to listen on: comma-separated names, the first one this host has wins.
  // Empty: loopback when every rank is on this host, else the first interface that is up with an
  // IPv4 address and is not loopback or a container bridge.
  std::string interfaces;
  // Called on the worker once the ring is connected, with this rank's address ("a.b.c.d:port").
  std::function<void(const std::string& address)> on_connected;
};

class SocketRing final : public Communicator {
 public:
  // A ring with a worker of its own over a duplicate of `comm` (collective).
  SocketRing(MPI_Comm comm, SocketRingOptions options);
  // A ring whose calls run on `worker` (shared with other communicators; not collective). The
  // worker's own options apply; `options`' WorkerOptions are not used.
  SocketRing(std::shared_ptr<detail::MpiWorker> worker, SocketRingOptions options);
  ~SocketRing() override;
  SocketRing(const SocketRing&) = delete;
  SocketRing& operator=(const SocketRing&) = delete;

  std::string backend() const override { return "socket-ring"; }
  int rank() const override { return worker_->rank(); }
  int size() const override { return worker_->size(); }

  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                         ReduceOp op = ReduceOp::Sum) override {
    return all_reduce_after_fill(tensor, {}, op);
  }
  std::unique_ptr<Work> all_reduce_after_fill(const torch::Tensor& tensor,
                                              std::function<void()> fill,
                                              ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const torch::Tensor& tensor, int root = 0) override;
  torch::Tensor all_gather(const torch::Tensor& tensor) override;
  void reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                      ReduceOp op = ReduceOp::Sum) override;
  void all_gather_into(const torch::Tensor& output, const torch::Tensor& input) override;
  void barrier() override;

  // Whether the connections are made (by the first collective). Any thread.
  bool connected() const;

  struct State;  // the connections and the buffers (worker thread only)

 private:
  std::unique_ptr<Work> submit(detail::Collective call, torch::Tensor target, torch::Tensor host,
                               std::function<void(State&)> run);
  // all_gather and all_gather_into: every rank's `input` into `output`, both on the CPU.
  void gather(detail::Collective call, const torch::Tensor& output, const torch::Tensor& input);

  std::shared_ptr<detail::MpiWorker> worker_;
  detail::Rules rules_;
  std::shared_ptr<State> state_;  // shared with the queued calls
};

}  // namespace ddp

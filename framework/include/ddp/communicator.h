#pragma once
/// \file
/// Collective operations on tensors: one interface, two backends (MpiCommunicator for CPU tensors,
/// NcclCommunicator for CUDA tensors), in the shape of c10d's ProcessGroup and Work.
///
/// Contract (as in MPI): every rank of a communicator calls the same collectives in the same
/// order, with tensors of the same shape and dtype. One thread at a time issues them.
///
/// all_reduce_async() starts an all-reduce and returns a Work handle at once; the backend
/// finishes it in the background (MPI: on the communicator's own worker thread; NCCL: on its own
/// CUDA stream). Until Work::wait() returns, the caller must neither read nor write the tensor.
/// The blocking calls are the same queue followed by a wait, so a blocking call issued after
/// asynchronous ones runs after them: the order of collectives is the order of the calls.

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

/// How all_reduce combines the ranks' values, element by element.
enum class ReduceOp {
  Sum,  ///< the sum
  Avg,  ///< the sum divided by the number of ranks (floating-point tensors only)
  Min,  ///< the smallest value
  Max,  ///< the largest value
};

/// Whether the CPU all-reduces of a job on several hosts go through one leader per host: reduced
/// on each host, all-reduced among the hosts' leaders, broadcast on each host
/// (ProcessGroupOptions:: hierarchical; docs/architecture.md). Every rank gets bitwise the same
/// result either way.
enum class HierarchicalAllReduce {
  Auto,  ///< when the ranks span several hosts and some host has several ranks
  On,    ///< always (with one host: a reduce and a broadcast on it; correct, not faster)
  Off,   ///< never: the flat all-reduce over every rank
};

/// A collective in flight.
class Work {
 public:
  using Clock = std::chrono::steady_clock;  ///< the clock of host_span()
  /// When the host ran a collective.
  struct Span {
    Clock::time_point start;  ///< the worker began it
    Clock::time_point end;    ///< the worker finished it
  };

  virtual ~Work() = default;
  /// Makes the result usable by what the calling thread does next, or rethrows the collective's
  /// error. MPI: the host waits until the worker thread has finished it. NCCL: the calling
  /// thread's current CUDA stream waits for the collective; the host does not.
  virtual void wait() = 0;
  /// When the host ran it (MPI's worker thread), once finished; NCCL runs it on the GPU and
  /// has no host span. For timelines.
  virtual std::optional<Span> host_span() const { return std::nullopt; }
};

/// Collectives over the ranks of a group (the contract is at the top of this file).
/// ProcessGroup makes them: cpu() over MPI for CPU tensors, gpu() over NCCL for CUDA tensors.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// "mpi", "nccl", ...
  virtual std::string backend() const = 0;
  /// This rank's index among the communicator's ranks, 0 .. size() - 1.
  virtual int rank() const = 0;
  /// The number of ranks.
  virtual int size() const = 0;

  /// Starts reducing `tensor` over all ranks, in place: after wait() every rank holds the result.
  /// The tensor must be contiguous and live where the backend can reach it.
  virtual std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                                 ReduceOp op = ReduceOp::Sum) = 0;
  /// all_reduce_async(tensor, op), with `fill` writing `tensor` first, when the all-reduce's turn
  /// comes: the call keeps its place in the order, and the caller need not wait for what `fill`
  /// needs. `fill` may wait() for earlier collectives (PowerSGD's Qs from the Ps' sum) and issues
  /// none. MPI and the TCP ring run it on their worker thread (for a CPU tensor); this default and
  /// NCCL at the call. What it throws, Work::wait() rethrows; the other ranks then wait in this
  /// all-reduce, as for any rank that fails in a collective.
  virtual std::unique_ptr<Work> all_reduce_after_fill(const torch::Tensor& tensor,
                                                      std::function<void()> fill,
                                                      ReduceOp op = ReduceOp::Sum);
  /// all_reduce_async(), then Work::wait().
  void all_reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) {
    all_reduce_async(tensor, op)->wait();
  }

  /// Overwrites `tensor` on every rank with root's values, in place.
  virtual void broadcast(const torch::Tensor& tensor, int root = 0) = 0;

  /// Returns a new tensor of shape [size(), tensor.sizes()...] holding every rank's tensor in
  /// rank order.
  virtual torch::Tensor all_gather(const torch::Tensor& tensor) = 0;

  /// Flat collectives in equal chunks (c10d's reduce_scatter_tensor / all_gather_into_tensor):
  /// `input` and `output` contiguous, of one dtype, on one device, and distinct; chunk r of a flat
  /// buffer of size() * n elements is [r n, (r + 1) n); sizes that do not divide are the caller's
  /// to pad. reduce_scatter: `input` has size() times the elements of `output`, which gets this
  /// rank's chunk of the reduction of every rank's `input` (left unchanged). The base class
  /// implements both over all_reduce() and all_gather() (size() times the bytes); MPI, NCCL and
  /// the TCP ring have their own.
  virtual void reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                              ReduceOp op = ReduceOp::Sum);
  /// all_gather_into: `output` has size() times the elements of `input`; every rank gets every
  /// rank's `input` in rank order (chunk r is rank r's).
  virtual void all_gather_into(const torch::Tensor& output, const torch::Tensor& input);

  /// Returns once every rank has called it.
  virtual void barrier() = 0;
};

/// Every rank's string, in rank order (collective; uses only all_reduce and all_gather).
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);

}  // namespace ddp

#pragma once
// Communicator backend over MPI, for CPU tensors (GPU tensors are staged through host memory:
// correct, not fast). Each call is checked and described (collective.h), queued on the
// communicator's worker (mpi_worker.h) and made there as MPI calls on the tensor's memory
// (mpi_types.h). Errors: Work::wait() rethrows a failing MPI call's, with MPI's message, the call
// and file:line (util/mpi_check.h).
//
// Large all-reduces (MpiOptions::blocking_bytes) first wait, asleep as the worker waits, for every
// rank (in the worker's agreement on the call), then make the blocking MPI_Allreduce: Open MPI's
// blocking all-reduce has faster algorithms for large messages, and sleeping while bytes move
// over TCP stalls them. Limit: a rank stopped in the middle of such a transfer leaves the others
// spinning until the timeout.

#include "comm/collective.h"
#include "comm/mpi/mpi_worker.h"

#include <ddp/communicator.h>

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace ddp {

struct MpiOptions : WorkerOptions {
  // All-reduces of at least this many bytes wait for every rank, then make the blocking
  // MPI_Allreduce (see above); smaller ones are one MPI_Iallreduce. 0: all of them.
  std::size_t blocking_bytes = 64 << 10;
};

class MpiCommunicator final : public Communicator {
 public:
  // Collective over `comm` (the worker's MPI_Comm_dup).
  explicit MpiCommunicator(MPI_Comm comm, MpiOptions options = {});
  // Releases the worker, which finishes the queued collectives first (mpi_worker.h).
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string backend() const override { return "mpi"; }
  int rank() const override { return worker_->rank(); }
  int size() const override { return worker_->size(); }

  // Supported dtypes: float32, float64, int32, int64, uint8, and float16/bfloat16 for Sum and
  // Avg (summed in float per element). Avg: floating point only.
  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                         ReduceOp op = ReduceOp::Sum) override {
    return all_reduce_after_fill(tensor, {}, op);
  }
  std::unique_ptr<Work> all_reduce_after_fill(const torch::Tensor& tensor,
                                              std::function<void()> fill,
                                              ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const torch::Tensor& tensor, int root = 0) override;
  torch::Tensor all_gather(const torch::Tensor& tensor) override;
  // MPI_Ireduce_scatter_block and MPI_Iallgather on the worker (at most INT_MAX elements per
  // rank); the dtypes and ops of all_reduce.
  void reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                      ReduceOp op = ReduceOp::Sum) override;
  void all_gather_into(const torch::Tensor& output, const torch::Tensor& input) override;
  void barrier() override;

  // The communicator the MPI calls use (the worker's duplicate; for benchmarks).
  MPI_Comm comm() const { return worker_->comm(); }
  // The worker, to share with the TCP ring (comm/compose/cpu_communicator.h).
  const std::shared_ptr<detail::MpiWorker>& worker() const { return worker_; }

 private:
  // all_gather and all_gather_into: `call` gathers every rank's `input` into `output` (host).
  void gather(detail::Collective call, const torch::Tensor& output, const torch::Tensor& input);

  MpiOptions options_;
  detail::Rules rules_;
  std::shared_ptr<detail::MpiWorker> worker_;
};

namespace detail {

// The all-reduce of `t` (on the host) in place over `comm`, on `worker`'s thread: the blocking
// MPI_Allreduce when `blocking` (first waiting in an MPI_Ibarrier when `arrive_first`), else
// MPI_Iallreduce, waited for by the worker.
void mpi_all_reduce(const MpiWorker& worker, MPI_Comm comm, const torch::Tensor& t,
                    MPI_Datatype type, MPI_Op reduce, bool blocking, bool arrive_first);

}  // namespace detail
}  // namespace ddp

#pragma once
// Communicator backend over MPI, for CPU tensors (tensors on a GPU are staged through host
// memory: correct, not fast). Each call is checked and described (comm/collective.h), queued on
// the communicator's worker (comm/mpi/mpi_worker.h: one thread that makes every MPI call of the
// communicator in call order, over a duplicate of the communicator it is given, under the
// watchdog of comm/mpi/mpi_watchdog.h, with the debug mode's check) and made there as MPI calls on
// the tensor's memory (datatypes and pieces: comm/mpi/mpi_types.h).
//
// Errors: a failing MPI call becomes an exception that Work::wait() rethrows on the caller's
// thread, with MPI's message, the call and file:line (util/mpi_check.h).
//
// Large all-reduces: one of at least MpiOptions::blocking_bytes first waits, as the worker
// waits (spin, then sleeps), in an MPI_Ibarrier (everyone has arrived), then makes the blocking
// MPI_Allreduce: Open MPI's blocking all-reduce uses faster algorithms for large messages than
// its non-blocking one, and sleeping while bytes move over TCP stalls them
// (docs/records/performance.md). Limit: a rank stopped after every rank arrived at such a large
// all-reduce (in the middle of the transfer) leaves the others spinning in it until the
// timeout. Smaller ones are one MPI_Iallreduce.
//
// Between hosts linked by TCP, ProcessGroup sends the large all-reduces over ddp's TCP ring on
// this communicator's worker instead (comm/compose/cpu_communicator.h); this class knows nothing of
// it.

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
  // All-reduces of at least this many bytes wait for every rank in an MPI_Ibarrier, then make
  // the blocking MPI_Allreduce (see above); smaller ones are one MPI_Iallreduce. 0: every
  // all-reduce so. ProcessGroup reads DDP_MPI_BLOCKING_KIB.
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

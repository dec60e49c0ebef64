#pragma once
// Communicator backend over MPI, for CPU tensors (tensors on a GPU are staged through host
// memory: correct, not fast). As c10d's ProcessGroupMPI does, it owns a worker thread that makes
// every blocking MPI call of this communicator, in the order the calls were made: an
// all_reduce_async() returns at once and the worker reduces while the caller computes, and the
// blocking collectives queue behind it and wait.
//
// It owns a duplicate of the communicator it is given, so its messages never match the
// application's own MPI traffic, nor another MpiCommunicator's (each worker thread then has a
// communicator of its own, which MPI needs for concurrent collectives).
//
// Needs MPI_THREAD_MULTIPLE (the worker and the caller's other MPI calls run at once); the
// constructor throws std::runtime_error saying so when MPI provides less.
//
// Errors: a failing MPI call becomes an exception that Work::wait() rethrows on the caller's
// thread, with MPI's message, the call and file:line (mpi_check.h).

#include <ddp/comm/communicator.h>

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace ddp {

struct MpiOptions {
  // How the worker waits for a collective. 0 (the default): a blocking MPI call, which
  // busy-polls (Open MPI yields the core when OMPI_MCA_mpi_yield_when_idle is set, as the
  // Runtime does when threads outnumber cores). > 0: a non-blocking call, tested in a spin for
  // at most 50 us, then every poll_interval with the worker asleep in between: far less CPU,
  // but slower over TCP in our measurements (docs/performance.md). DDP_MPI_POLL_US sets it for
  // ProcessGroup's communicators.
  std::chrono::microseconds poll_interval{0};

  // The largest message of one MPI_Allreduce: a larger all-reduce is made of consecutive calls
  // on pieces of at most this many bytes (the result is the same, element by element). 0 (the
  // default): one call per tensor (up to INT_MAX elements). Why it exists: Open MPI moved large
  // messages slower per byte than pieces of a few MiB in our measurements, over shared memory
  // (cache) and over TCP (docs/performance.md); the default stays 0 until a quiet-machine
  // benchmark shows pieces help end to end. DDP_MPI_MESSAGE_KIB sets it for ProcessGroup.
  std::size_t max_message_bytes = 0;
};

namespace detail {
struct MpiTask;  // one queued collective: its MPI calls, and its state once run
}

class MpiCommunicator final : public Communicator {
 public:
  // Collective over `comm` (MPI_Comm_dup).
  explicit MpiCommunicator(MPI_Comm comm, MpiOptions options = {});
  // Finishes the queued collectives, joins the worker and frees the duplicate.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Supported dtypes: float32, float64, int32, int64, uint8, and float16/bfloat16 for Sum and
  // Avg (summed in float per element). Avg: floating point only.
  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                         ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const torch::Tensor& tensor, int root = 0) override;
  torch::Tensor all_gather(const torch::Tensor& tensor) override;
  void barrier() override;

  MPI_Comm comm() const { return comm_; }

 private:
  std::shared_ptr<detail::MpiTask> submit(std::function<void()> run);
  void worker_loop();

  MpiOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<detail::MpiTask>> queue_;  // submitted, not yet started; oldest first
  bool stopping_ = false;
  std::thread worker_;  // started last, joined first
};

}  // namespace ddp

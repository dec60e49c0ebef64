#pragma once
// Communicator backend over NCCL, for CUDA tensors on one GPU (built with DDP_WITH_CUDA and
// DDP_WITH_NCCL); ProcessGroup::gpu() holds the process's one. It knows nothing of the job beyond
// its bootstrap MPI communicator, rank, size, device and NcclOptions.
//
// Streams: collectives run on a stream of their own, so they overlap the computation on
// LibTorch's current stream. Each waits for the work queued so far on the caller's current stream,
// and the blocking calls make the current stream wait for the collective (all_reduce_async()
// leaves that to Work::wait()): the host never waits, and the next kernel sees the result. Every
// tensor a collective touches is recordStream()ed, so freeing it cannot hand its memory on while
// NCCL still uses it.
//
// Errors: a failing call throws (DDP_NCCL_CHECK / DDP_CUDA_CHECK: rank, host, file:line, the
// library's message). A watchdog thread aborts the NCCL communicator on an asynchronous error or a
// collective unfinished after the timeout (counted from when it was queued) and calls
// NcclOptions::on_fatal_error naming the rank, the device and the collective, so a dead or
// diverging peer cannot leave the others hanging.
//
// One thread at a time issues the collectives, in the same order on every rank (communicator.h).

#include "comm/collective.h"

#include <ddp/communicator.h>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <torch/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddp {

struct NcclOptions {
  // A collective unfinished this long after it was queued is fatal.
  std::chrono::seconds timeout{600};
  // Called on the watchdog thread after the NCCL communicator is aborted, with the reason; must
  // not return (end the process or the job). Unset: the message goes to stderr and the process
  // calls std::abort().
  std::function<void(const std::string&)> on_fatal_error;
};

class NcclCommunicator final : public Communicator {
 public:
  // Collective over every rank of `bootstrap` (`rank` and `size` are this rank's place in it):
  // rank 0 creates the NCCL unique id, MPI broadcasts it, every rank joins on `device`, which
  // must be a CUDA device.
  NcclCommunicator(MPI_Comm bootstrap, int rank, int size, torch::Device device,
                   NcclOptions options);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Tensors must be contiguous and on device(). Dtypes: float32, float64, float16, bfloat16,
  // int32, int64, uint8, int8; Avg (ncclAvg) needs a floating-point tensor.
  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                         ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const torch::Tensor& tensor, int root = 0) override;
  torch::Tensor all_gather(const torch::Tensor& tensor) override;
  // ncclReduceScatter and ncclAllGather; as broadcast, the current stream is ordered after them.
  void reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                      ReduceOp op = ReduceOp::Sum) override;
  void all_gather_into(const torch::Tensor& output, const torch::Tensor& input) override;
  // Returns when every rank has reached it: a one-element all-reduce that the host waits for.
  void barrier() override;

  torch::Device device() const { return device_; }
  // The stream the collectives run on.
  c10::cuda::CUDAStream stream() const;

 private:
  struct Pending;  // a collective in flight: what it is, when it was queued, its end event
  struct StreamDeleter {
    void operator()(cudaStream_t stream) const;
  };

  // Numbers `call` and queues it on the NCCL stream.
  std::shared_ptr<Pending> enqueue(detail::Collective call,
                                   const std::vector<torch::Tensor>& tensors,
                                   const std::function<ncclResult_t(cudaStream_t)>& launch);
  void watch();
  [[noreturn]] void fail(const std::string& why);

  torch::Device device_;
  int rank_;
  int size_;
  NcclOptions options_;
  detail::Rules rules_;  // contiguous, on device_, NCCL's dtypes (comm/collective.h)
  int64_t calls_ = 0;    // collectives queued so far (the caller's thread)
  std::unique_ptr<CUstream_st, StreamDeleter> stream_;  // destroyed after comm_
  ncclComm_t comm_ = nullptr;

  // Watchdog: the collectives not yet seen finished, oldest first.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Pending>> pending_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace ddp

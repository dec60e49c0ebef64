#pragma once
// A Communicator whose all-reduce can be started now and finished later: NCCL queues it on a
// CUDA stream of its own and returns at once. The reducer uses this to overlap bucket
// all-reduces with backward without a communication thread.

#include <ddp/communicator.h>

#include <torch/types.h>

#include <memory>

namespace ddp {

// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Makes the result usable by what the calling thread queues next. For CUDA tensors that is
  // the work queued on LibTorch's current stream, so the host need not wait.
  virtual void wait() = 0;
};

class AsyncCommunicator : public Communicator {
 public:
  // Starts all_reduce(tensor, op). Until the returned Work's wait() the caller must neither read
  // nor write the tensor.
  virtual std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                                 ReduceOp op = ReduceOp::Sum) = 0;

  void all_reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) override {
    all_reduce_async(tensor, op)->wait();
  }
};

}  // namespace ddp

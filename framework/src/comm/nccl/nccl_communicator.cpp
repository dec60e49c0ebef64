#include "comm/nccl/nccl_communicator.h"

#include "comm/nccl/nccl_bootstrap.h"

#include "util/cuda_check.h"
#include "util/nccl_check.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <utility>

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kWatchdogPoll = std::chrono::milliseconds(100);

ncclDataType_t nccl_type(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat:
      return ncclFloat32;
    case torch::kDouble:
      return ncclFloat64;
    case torch::kHalf:
      return ncclFloat16;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kInt:
      return ncclInt32;
    case torch::kLong:
      return ncclInt64;
    case torch::kByte:
      return ncclUint8;
    case torch::kChar:
      return ncclInt8;
    default:
      throw std::logic_error(std::string("ddp: no NCCL datatype for ") + c10::toString(type) +
                             " (NCCL's rules should have refused it)");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Min:
      return ncclMin;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Avg:
      return ncclAvg;  // floating point only: the rules checked it
  }
  throw std::invalid_argument("NcclCommunicator::all_reduce: unknown ReduceOp");
}

}  // namespace

struct NcclCommunicator::Pending {
  explicit Pending(detail::Collective c) : call(std::move(c)) {}
  detail::Collective call;
  Clock::time_point queued = Clock::now();
  at::cuda::CUDAEvent done;  // recorded on the NCCL stream after the collective
};

namespace {

// Orders the waiting thread's current stream after the collective; the host does not wait.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done, c10::DeviceIndex device)
      : done_(std::move(done)), device_(device) {}
  void wait() override { done_->block(c10::cuda::getCurrentCUDAStream(device_)); }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  c10::DeviceIndex device_;
};

}  // namespace

void NcclCommunicator::StreamDeleter::operator()(cudaStream_t stream) const {
  cudaStreamDestroy(stream);
}

NcclCommunicator::NcclCommunicator(MPI_Comm bootstrap, int rank, int size, torch::Device device,
                                   NcclOptions options)
    : device_(device), rank_(rank), size_(size), options_(std::move(options)) {
  rules_.prefix = "NcclCommunicator::";
  rules_.dtypes = {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16,
                   torch::kInt,   torch::kLong,   torch::kByte, torch::kChar};
  rules_.device = device_;
  rules_.device_reason = "rank " + std::to_string(rank_) + "'s NCCL communicator works on " +
                         device_.str() + " (CPU tensors go through ProcessGroup::cpu())";
  if (!device_.is_cuda()) {
    throw std::invalid_argument("NcclCommunicator: rank " + std::to_string(rank_) +
                                " computes on " + device_.str() +
                                ", but NCCL needs a CUDA device (Runtime::device())");
  }
  if (options_.timeout.count() <= 0) {
    throw std::invalid_argument("NcclCommunicator: the timeout must be > 0 s (got " +
                                std::to_string(options_.timeout.count()) + ")");
  }
  c10::cuda::CUDAGuard guard(device_.index());
  // The highest priority: the GPU then schedules a bucket's all-reduce ahead of the backward
  // kernels queued beside it instead of after them, which is what lets it overlap.
  int least = 0, greatest = 0;
  DDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), rank_);
  cudaStream_t stream = nullptr;
  DDP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest), rank_);
  stream_.reset(stream);

  const ncclUniqueId id = broadcast_nccl_unique_id(bootstrap, rank_);
  DDP_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), rank_);
  try {
    watchdog_ = std::thread([this] { watch(); });
  } catch (...) {
    ncclCommAbort(comm_);
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  watchdog_.join();
  // Destroy waits for the collectives still queued. After an error, or while an exception
  // unwinds (the peers may never join those collectives), that could hang: abort instead.
  ncclResult_t async_error = ncclSuccess;
  const ncclResult_t query = ncclCommGetAsyncError(comm_, &async_error);
  if (query == ncclSuccess && async_error == ncclSuccess && std::uncaught_exceptions() == 0) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
}

c10::cuda::CUDAStream NcclCommunicator::stream() const {
  return c10::cuda::getStreamFromExternal(stream_.get(), device_.index());
}

std::shared_ptr<NcclCommunicator::Pending> NcclCommunicator::enqueue(
    detail::Collective call, const std::vector<torch::Tensor>& tensors,
    const std::function<ncclResult_t(cudaStream_t)>& launch) {
  call.seq = ++calls_;
  c10::cuda::CUDAGuard guard(device_.index());
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  const c10::cuda::CUDAStream nccl = stream();
  at::cuda::CUDAEvent inputs_ready;
  inputs_ready.record(current);
  inputs_ready.block(nccl);
  DDP_NCCL_CHECK(launch(nccl.stream()), rank_);
  for (const torch::Tensor& tensor : tensors) {
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), nccl);
  }
  auto pending = std::make_shared<Pending>(std::move(call));
  pending->done.record(nccl);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(pending);
  }
  return pending;
}

std::unique_ptr<Work> NcclCommunicator::all_reduce_async(const torch::Tensor& tensor, ReduceOp op) {
  detail::Collective call = detail::Collective::all_reduce(rules_, tensor, op);
  const ncclDataType_t type = nccl_type(tensor.scalar_type());
  const ncclRedOp_t nccl_reduce = nccl_op(op);
  void* data = tensor.data_ptr();
  const auto pending = enqueue(std::move(call), {tensor}, [&](cudaStream_t stream) {
    return ncclAllReduce(data, data, tensor.numel(), type, nccl_reduce, comm_, stream);
  });
  // The Work keeps the Pending alive (the watchdog drops its own reference once the collective
  // is done) but needs only its event.
  return std::make_unique<NcclWork>(std::shared_ptr<at::cuda::CUDAEvent>(pending, &pending->done),
                                    device_.index());
}

void NcclCommunicator::broadcast(const torch::Tensor& tensor, int root) {
  detail::Collective call = detail::Collective::broadcast(rules_, tensor, root, size_);
  const ncclDataType_t type = nccl_type(tensor.scalar_type());
  void* data = tensor.data_ptr();
  const auto pending = enqueue(std::move(call), {tensor}, [&](cudaStream_t stream) {
    return ncclBroadcast(data, data, tensor.numel(), type, root, comm_, stream);
  });
  pending->done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
}

torch::Tensor NcclCommunicator::all_gather(const torch::Tensor& tensor) {
  detail::Collective call = detail::Collective::all_gather(rules_, tensor);
  const ncclDataType_t type = nccl_type(tensor.scalar_type());
  std::vector<int64_t> shape{size_};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  torch::Tensor gathered = torch::empty(shape, tensor.options());
  const auto pending = enqueue(std::move(call), {tensor, gathered}, [&](cudaStream_t stream) {
    return ncclAllGather(tensor.data_ptr(), gathered.data_ptr(), tensor.numel(), type, comm_,
                         stream);
  });
  pending->done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
  return gathered;
}

void NcclCommunicator::reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                                      ReduceOp op) {
  detail::Collective call = detail::Collective::reduce_scatter(rules_, output, input, op, size_);
  const ncclDataType_t type = nccl_type(input.scalar_type());
  const ncclRedOp_t nccl_reduce = nccl_op(op);
  const auto pending = enqueue(std::move(call), {input, output}, [&](cudaStream_t stream) {
    return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type, nccl_reduce,
                             comm_, stream);
  });
  pending->done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
}

void NcclCommunicator::all_gather_into(const torch::Tensor& output, const torch::Tensor& input) {
  detail::Collective call = detail::Collective::all_gather_into(rules_, output, input, size_);
  const ncclDataType_t type = nccl_type(input.scalar_type());
  const auto pending = enqueue(std::move(call), {input, output}, [&](cudaStream_t stream) {
    return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), type, comm_, stream);
  });
  pending->done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
}

void NcclCommunicator::barrier() {
  const torch::Tensor token =
      torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  void* data = token.data_ptr();
  const auto pending = enqueue(detail::Collective::barrier(), {token}, [&](cudaStream_t stream) {
    return ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, comm_, stream);
  });
  // A barrier orders the ranks' host code, not just their streams: the host waits here.
  pending->done.synchronize();
}

void NcclCommunicator::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, kWatchdogPoll, [this] { return stopping_; })) {
    ncclResult_t async_error = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &async_error);
    if (query != ncclSuccess || async_error != ncclSuccess) {
      const char* last = ncclGetLastError(comm_);
      fail(std::string("asynchronous NCCL error: ") +
           ncclGetErrorString(query != ncclSuccess ? query : async_error) +
           (last && *last ? " (" + std::string(last) + ")" : std::string()));
    }
    try {
      while (!pending_.empty() && pending_.front()->done.query()) pending_.pop_front();
    } catch (const std::exception& e) {
      fail(std::string("CUDA error while watching the NCCL stream: ") + e.what());
    }
    if (!pending_.empty() && Clock::now() - pending_.front()->queued > options_.timeout) {
      fail("NCCL " + pending_.front()->call.describe() + " did not finish within " +
           std::to_string(options_.timeout.count()) +
           " s (DDP_NCCL_TIMEOUT_SECONDS): another rank died, hangs, or issued different "
           "collectives");
    }
  }
}

void NcclCommunicator::fail(const std::string& why) {
  // Aborting first releases this process's threads blocked on NCCL; the other ranks cannot
  // finish their collectives without this one, so the whole job ends.
  ncclCommAbort(comm_);
  const std::string message = "NCCL communicator on " + device_.str() + ": " + why;
  if (options_.on_fatal_error) options_.on_fatal_error(message);
  std::fprintf(stderr, "ddp: rank %d: %s\n", rank_, message.c_str());
  std::abort();
}

}  // namespace ddp

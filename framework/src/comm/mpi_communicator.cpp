#include <ddp/comm/mpi_communicator.h>

#include "util/mpi_check.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <exception>
#include <stdexcept>
#include <string>

namespace ddp {

namespace {

// MPI has no 16-bit floating-point types: they travel as 2-byte integers and are summed by a
// user-defined operation that computes in float, as the hardware would.
template <typename T>
void sum_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

MPI_Op sum_op_16bit(torch::ScalarType type) {
  // Created once per process on first use; MPI_Finalize releases them.
  static MPI_Op half_sum = [] {
    MPI_Op op;
    DDP_MPI_CHECK(MPI_Op_create(&sum_16bit<c10::Half>, /*commute=*/1, &op));
    return op;
  }();
  static MPI_Op bf16_sum = [] {
    MPI_Op op;
    DDP_MPI_CHECK(MPI_Op_create(&sum_16bit<c10::BFloat16>, /*commute=*/1, &op));
    return op;
  }();
  return type == torch::kHalf ? half_sum : bf16_sum;
}

bool is_16bit_float(const torch::Tensor& t) {
  return t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
}

MPI_Datatype mpi_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kHalf:
    case torch::kBFloat16: return MPI_UINT16_T;
    case torch::kFloat: return MPI_FLOAT;
    case torch::kDouble: return MPI_DOUBLE;
    case torch::kInt: return MPI_INT32_T;
    case torch::kLong: return MPI_INT64_T;
    case torch::kByte: return MPI_UINT8_T;
    default:
      throw std::invalid_argument(std::string("MpiCommunicator: unsupported dtype ") +
                                  std::string(c10::toString(t.scalar_type())));
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
  }
  throw std::invalid_argument("MpiCommunicator: unknown ReduceOp");
}

void check_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + ": undefined tensor");
  if (!t.is_contiguous()) {
    throw std::invalid_argument(std::string(what) + ": tensor must be contiguous");
  }
}

// Calls fn(data, count) on consecutive pieces of t: at most max_bytes each (MpiOptions::
// max_message_bytes; 0: no limit), and never more than INT_MAX elements (MPI counts are int).
template <typename Fn>
void for_each_chunk(const torch::Tensor& t, std::size_t max_bytes, Fn fn) {
  const int64_t n = t.numel();
  const int64_t element_size = static_cast<int64_t>(t.element_size());
  const int64_t per_call = max_bytes == 0
      ? INT_MAX
      : std::clamp<int64_t>(static_cast<int64_t>(max_bytes) / element_size, 1, INT_MAX);
  char* base = static_cast<char*>(t.data_ptr());
  for (int64_t offset = 0; offset < n; offset += per_call) {
    const int count = static_cast<int>(std::min<int64_t>(per_call, n - offset));
    fn(base + offset * element_size, count);
  }
}

// MPI reads and writes host memory: a tensor elsewhere (a GPU) goes through a host copy, made
// on the caller's thread (so it follows the caller's CUDA stream) and copied back by wait().
// Slow but correct; CUDA tensors belong on the NCCL backend.
torch::Tensor on_host(const torch::Tensor& t) { return t.is_cpu() ? t : t.to(torch::kCPU); }

// Waits for a non-blocking collective (MpiOptions::poll_interval > 0). MPI moves a TCP transfer
// along only while a thread polls it, and a blocking MPI call polls without pause: a core spent
// for the whole transfer. Here the worker spins only briefly (small collectives finish in
// microseconds), then sleeps `poll` between tests. Measured on two emulated hosts it burns far
// less CPU but is slower (docs/performance.md), so it is not the default.
void wait_for(MPI_Request& request, std::chrono::microseconds poll) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::microseconds(50);
  const auto spin_until = Clock::now() + kSpin;
  int done = 0;
  DDP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  while (!done) {
    if (poll.count() > 0 && Clock::now() > spin_until) std::this_thread::sleep_for(poll);
    DDP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  }
}

}  // namespace

namespace detail {

struct MpiTask {
  explicit MpiTask(std::function<void()> r) : run(std::move(r)) {}
  std::function<void()> run;  // the MPI calls, made on the worker thread
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  Work::Span span{};
};

}  // namespace detail

namespace {

class MpiWork final : public Work {
 public:
  // `host` is what the worker reduces; `target` receives it afterwards (a GPU tensor).
  MpiWork(std::shared_ptr<detail::MpiTask> task, torch::Tensor target = {},
          torch::Tensor host = {})
      : task_(std::move(task)), target_(std::move(target)), host_(std::move(host)) {}

  void wait() override {
    {
      std::unique_lock<std::mutex> lock(task_->mutex);
      task_->finished.wait(lock, [&] { return task_->done; });
      if (task_->error) std::rethrow_exception(task_->error);
    }
    if (target_.defined() && !target_.is_same(host_)) target_.copy_(host_);
    target_ = host_ = torch::Tensor();
  }
  std::exception_ptr error() const override {
    std::lock_guard<std::mutex> lock(task_->mutex);
    return task_->error;
  }
  std::optional<Span> host_span() const override {
    std::lock_guard<std::mutex> lock(task_->mutex);
    if (!task_->done) return std::nullopt;
    return task_->span;
  }

 private:
  std::shared_ptr<detail::MpiTask> task_;
  torch::Tensor target_, host_;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, MpiOptions options) : options_(options) {
  int level = MPI_THREAD_SINGLE;
  DDP_MPI_CHECK(MPI_Query_thread(&level));
  if (level < MPI_THREAD_MULTIPLE) {
    throw std::runtime_error(
        "MpiCommunicator: MPI provides thread level " + std::to_string(level) +
        ", but the communicator makes its MPI calls on a worker thread of its own and needs "
        "MPI_THREAD_MULTIPLE (" + std::to_string(MPI_THREAD_MULTIPLE) +
        "): initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) (ddp::Runtime does), with an "
        "MPI built with thread support");
  }
  DDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  // Errors come back as codes, so DDP_MPI_CHECK can report them with MPI's message.
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  worker_ = std::thread([this] { worker_loop(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::shared_ptr<detail::MpiTask> MpiCommunicator::submit(std::function<void()> run) {
  auto task = std::make_shared<detail::MpiTask>(std::move(run));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(task);
  }
  wake_.notify_one();
  return task;
}

void MpiCommunicator::worker_loop() {
  for (;;) {
    std::shared_ptr<detail::MpiTask> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // The worker sleeps on the condition variable between collectives; it spins only inside
      // MPI calls (as MPI's progress engine does).
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    const auto start = Work::Clock::now();
    try {
      task->run();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(task->mutex);
      task->error = error;
      task->span = {start, Work::Clock::now()};
      task->done = true;
      task->run = nullptr;  // releases the tensors it captured
    }
    task->finished.notify_all();
  }
}

std::unique_ptr<Work> MpiCommunicator::all_reduce_async(const torch::Tensor& tensor, ReduceOp op) {
  check_contiguous(tensor, "MpiCommunicator::all_reduce");
  if (op == ReduceOp::Avg && !tensor.is_floating_point()) {
    throw std::invalid_argument("MpiCommunicator::all_reduce: Avg needs a floating-point tensor");
  }
  const MPI_Datatype type = mpi_type(tensor);
  MPI_Op mpi_reduce_op = MPI_OP_NULL;
  if (is_16bit_float(tensor)) {
    if (op != ReduceOp::Sum && op != ReduceOp::Avg) {
      throw std::invalid_argument("MpiCommunicator::all_reduce: float16/bfloat16 support Sum and Avg only");
    }
    mpi_reduce_op = sum_op_16bit(tensor.scalar_type());
  } else {
    mpi_reduce_op = mpi_op(op);
  }
  const torch::Tensor host = on_host(tensor);
  const MPI_Comm comm = comm_;
  const int size = size_;
  const auto poll = options_.poll_interval;
  const std::size_t max_bytes = options_.max_message_bytes;
  auto task = submit([host, type, mpi_reduce_op, op, comm, size, poll, max_bytes] {
    for_each_chunk(host, max_bytes, [&](void* data, int count) {
      if (poll.count() == 0) {
        DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, mpi_reduce_op, comm));
        return;
      }
      MPI_Request request;
      DDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_reduce_op, comm, &request));
      wait_for(request, poll);
    });
    if (op == ReduceOp::Avg) host.div_(size);
  });
  return std::make_unique<MpiWork>(std::move(task), tensor, host);
}

void MpiCommunicator::broadcast(const torch::Tensor& tensor, int root) {
  check_contiguous(tensor, "MpiCommunicator::broadcast");
  const MPI_Datatype type = mpi_type(tensor);
  const torch::Tensor host = on_host(tensor);
  const MPI_Comm comm = comm_;
  const auto poll = options_.poll_interval;
  auto task = submit([host, type, root, comm, poll] {
    for_each_chunk(host, 0, [&](void* data, int count) {
      if (poll.count() == 0) {
        DDP_MPI_CHECK(MPI_Bcast(data, count, type, root, comm));
        return;
      }
      MPI_Request request;
      DDP_MPI_CHECK(MPI_Ibcast(data, count, type, root, comm, &request));
      wait_for(request, poll);
    });
  });
  MpiWork(std::move(task), tensor, host).wait();
}

torch::Tensor MpiCommunicator::all_gather(const torch::Tensor& tensor) {
  check_contiguous(tensor, "MpiCommunicator::all_gather");
  if (tensor.numel() > INT_MAX) {
    throw std::invalid_argument("MpiCommunicator::all_gather: more than INT_MAX elements");
  }
  std::vector<int64_t> shape{size_};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  const torch::Tensor host = tensor.to(torch::kCPU);
  torch::Tensor out = torch::empty(shape, host.options());
  const MPI_Comm comm = comm_;
  const auto poll = options_.poll_interval;
  auto task = submit([host, out, comm, poll] {
    const int count = static_cast<int>(host.numel());
    const MPI_Datatype type = mpi_type(host);
    if (poll.count() == 0) {
      DDP_MPI_CHECK(MPI_Allgather(host.data_ptr(), count, type, out.data_ptr(), count, type, comm));
      return;
    }
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Iallgather(host.data_ptr(), count, type, out.data_ptr(), count, type, comm,
                                 &request));
    wait_for(request, poll);
  });
  MpiWork(std::move(task)).wait();
  return out.to(tensor.device());
}

void MpiCommunicator::barrier() {
  const MPI_Comm comm = comm_;
  const auto poll = options_.poll_interval;
  auto task = submit([comm, poll] {
    if (poll.count() == 0) {
      DDP_MPI_CHECK(MPI_Barrier(comm));
      return;
    }
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ibarrier(comm, &request));
    wait_for(request, poll);
  });
  MpiWork(std::move(task)).wait();
}

}  // namespace ddp

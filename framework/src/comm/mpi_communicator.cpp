#include "comm/mpi_communicator.h"

#include "comm/socket_ring.h"
#include "util/mpi_check.h"

#include <ddp/stop_signal.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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

using Clock = std::chrono::steady_clock;

// The watchdogs' messages on their private communicator.
constexpr int kQuestionTag = 1;  // "what is your worker doing?" (the asker's sequence number)
constexpr int kAnswerTag = 2;    // {last sequence number entered, in it (0/1), its CallKind}
constexpr auto kWatchdogPoll = std::chrono::milliseconds(100);
// How long a timed-out rank waits for the others' answers before naming the silent ones.
constexpr auto kAnswerWait = std::chrono::seconds(2);

const char* dtype_name(int64_t type) {
  switch (static_cast<torch::ScalarType>(type)) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kInt: return "int32";
    case torch::kLong: return "int64";
    case torch::kByte: return "uint8";
    default: return c10::toString(static_cast<torch::ScalarType>(type));
  }
}

const char* reduce_op_name(int64_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

}  // namespace

namespace detail {

enum CallKind : int64_t { kAllReduce = 1, kBroadcast = 2, kAllGather = 3, kBarrier = 4 };

static const char* kind_name(int64_t kind) {
  switch (kind) {
    case kAllReduce: return "all_reduce";
    case kBroadcast: return "broadcast";
    case kAllGather: return "all_gather";
    case kBarrier: return "barrier";
  }
  return "collective";
}

// What identifies a call across ranks, as the debug mode all-gathers it: kind, sequence number,
// dtype (-1: none), reduce op or root (-1: none), number of dimensions, elements, the first
// kShownDims sizes.
constexpr int kShownDims = 6;
constexpr int kFingerprint = 6 + kShownDims;

static std::string describe(const int64_t* f) {
  std::string text = std::string(kind_name(f[0])) + " #" + std::to_string(f[1]);
  if (f[2] >= 0) {
    text += std::string(" ") + dtype_name(f[2]) + "[";
    for (int64_t d = 0; d < f[4]; ++d) {
      if (d == kShownDims) {
        text += ",...";
        break;
      }
      text += (d ? "," : "") + std::to_string(f[6 + d]);
    }
    text += "]";
  }
  if (f[0] == kAllReduce) text += std::string(" (") + reduce_op_name(f[3]) + ")";
  if (f[0] == kBroadcast) text += " (root " + std::to_string(f[3]) + ")";
  return text;
}

struct MpiTask {
  MpiTask(CallKind k, const torch::Tensor& tensor, int64_t extra) : kind(k), extra(extra) {
    if (tensor.defined()) {
      dtype = static_cast<int64_t>(tensor.scalar_type());
      sizes = tensor.sizes().vec();
    }
  }
  void fingerprint(int64_t* f) const {
    std::fill(f, f + kFingerprint, 0);
    f[0] = kind;
    f[1] = seq;
    f[2] = dtype;
    f[3] = extra;
    f[4] = static_cast<int64_t>(sizes.size());
    f[5] = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      f[5] *= sizes[d];
      if (d < kShownDims) f[6 + d] = sizes[d];
    }
    if (dtype < 0) f[4] = f[5] = 0;
  }
  std::string what() const {
    int64_t f[kFingerprint];
    fingerprint(f);
    return describe(f);
  }

  const CallKind kind;
  int64_t seq = 0;     // set by submit()
  int64_t dtype = -1;  // torch::ScalarType of the tensor, -1 without one
  std::vector<int64_t> sizes;
  const int64_t extra;  // ReduceOp, the root, or -1
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

// A network device that MPI can use faster than TCP: InfiniBand/RoCE (verbs, UCX) or HPE
// Slingshot (libfabric cxi).
bool fast_network_device() {
  namespace fs = std::filesystem;
  std::error_code error;
  for (const char* dir : {"/sys/class/infiniband", "/sys/class/cxi"}) {
    if (fs::is_directory(dir, error) && !fs::is_empty(dir, error)) return true;
  }
  return false;
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  return text;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, MpiOptions options) : options_(std::move(options)) {
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
  if (options_.timeout.count() <= 0) {
    throw std::invalid_argument("MpiOptions::timeout must be > 0 seconds (got " +
                                std::to_string(options_.timeout.count()) + ")");
  }
  DDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  // Errors come back as codes, so DDP_MPI_CHECK can report them with MPI's message.
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  DDP_MPI_CHECK(MPI_Comm_dup(comm_, &watch_comm_));
  DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  if (size_ > 1 && options_.sockets != MpiOptions::Sockets::Never) {
    MPI_Comm node = MPI_COMM_NULL;
    DDP_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    int local = 0;
    DDP_MPI_CHECK(MPI_Comm_size(node, &local));
    DDP_MPI_CHECK(MPI_Comm_free(&node));
    single_host_ = local == size_;  // the same answer on every rank
    use_sockets_ = options_.sockets == MpiOptions::Sockets::Always;
    if (options_.sockets == MpiOptions::Sockets::Auto && !single_host_) {
      int fast = fast_network_device() ? 1 : 0;  // one rank with such a device keeps MPI for all
      DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &fast, 1, MPI_INT, MPI_MAX, comm_));
      use_sockets_ = fast == 0;
    }
  }
  // The watchdog's receive for questions is posted before anyone can ask.
  DDP_MPI_CHECK(MPI_Irecv(&question_buffer_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQuestionTag,
                          watch_comm_, &question_));
  worker_ = std::thread([this] { worker_loop(); });
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();  // the queued collectives finish under the watchdog
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    watch_stopping_ = true;
  }
  watch_wake_.notify_all();
  watchdog_.join();
  if (mpi_finalized()) return;
  if (question_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&question_);
    MPI_Wait(&question_, MPI_STATUS_IGNORE);
  }
  for (auto& answer : answers_) {
    // An answer to a rank that is gone may never be received: let MPI finish it alone (its
    // buffer must outlive it, so it is leaked; a few bytes, only after a watchdog question).
    if (answer->request != MPI_REQUEST_NULL) {
      MPI_Request_free(&answer->request);
      (void)answer.release();
    }
  }
  if (watch_comm_ != MPI_COMM_NULL) MPI_Comm_free(&watch_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::shared_ptr<detail::MpiTask> MpiCommunicator::submit(std::shared_ptr<detail::MpiTask> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task->seq = ++submitted_;
    queue_.push_back(task);
  }
  wake_.notify_one();
  return task;
}

void MpiCommunicator::wait_for(MPI_Request& request) {
  int done = 0;
  DDP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  if (done) return;
  // Open MPI moves a collective along only inside MPI calls: while every rank is there, testing
  // without pause is what keeps it fast. Past `spin`, a peer is late (or stopped, or dead), and
  // sleeping between tests frees the core; the sleep doubles so a long wait costs a few
  // wake-ups per second per millisecond of max_sleep, while a peer arriving soon is noticed soon.
  const auto spin_until = Clock::now() + options_.spin;
  const bool may_sleep = options_.max_sleep.count() > 0;
  std::chrono::microseconds sleep(20);
  for (;;) {
    DDP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (may_sleep && Clock::now() >= spin_until) {
      std::this_thread::sleep_for(std::min(sleep, options_.max_sleep));
      if (sleep < options_.max_sleep) sleep *= 2;
    }
  }
}

void MpiCommunicator::check_same_call(const detail::MpiTask& task) {
  using detail::kFingerprint;
  int64_t mine[kFingerprint];
  task.fingerprint(mine);
  std::vector<int64_t> all(static_cast<size_t>(kFingerprint) * size_);
  MPI_Request request;
  DDP_MPI_CHECK(MPI_Iallgather(mine, kFingerprint, MPI_INT64_T, all.data(), kFingerprint,
                               MPI_INT64_T, comm_, &request));
  wait_for(request);
  const int64_t* first = all.data();
  std::vector<std::string> others;
  for (int r = 1; r < size_; ++r) {
    const int64_t* row = first + static_cast<size_t>(kFingerprint) * r;
    if (!std::equal(first, first + kFingerprint, row)) {
      others.push_back("rank " + std::to_string(r) + " called " + detail::describe(row));
    }
  }
  if (others.empty()) return;
  // Every rank gathered the same rows, so every rank throws this same message and none runs
  // the collective: the communicator stays usable, and the job ends from the caller's error.
  throw std::runtime_error("DDP_DEBUG=DETAIL: the ranks call different collectives on one "
                           "communicator: rank 0 called " + detail::describe(first) + " but " +
                           join(others));
}

void MpiCommunicator::worker_loop() {
  for (;;) {
    std::shared_ptr<detail::MpiTask> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // The worker sleeps on the condition variable between collectives.
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto start = Work::Clock::now();
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      state_.seq = task->seq;
      state_.in_collective = true;
      state_.kind = static_cast<int>(task->kind);
      state_.task = task;  // described only if the watchdog fires
      state_.entered = Clock::now();
    }
    std::exception_ptr error;
    try {
      if (options_.check_collectives) check_same_call(*task);
      task->run();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      state_.in_collective = false;
      state_.task = nullptr;
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

void MpiCommunicator::answer_questions() {
  if (mpi_finalized()) return;
  // Answers sent earlier: forget the finished ones.
  while (!answers_.empty()) {
    int done = 0;
    MPI_Test(&answers_.front()->request, &done, MPI_STATUS_IGNORE);
    if (!done) break;
    answers_.pop_front();
  }
  for (;;) {
    int asked = 0;
    MPI_Status status;
    if (question_ == MPI_REQUEST_NULL ||
        MPI_Test(&question_, &asked, &status) != MPI_SUCCESS || !asked) {
      return;
    }
    auto answer = std::make_unique<Answer>();
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      answer->values[0] = state_.seq;
      answer->values[1] = state_.in_collective ? 1 : 0;
      answer->values[2] = state_.kind;
    }
    MPI_Isend(answer->values, 3, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag, watch_comm_,
              &answer->request);
    answers_.push_back(std::move(answer));
    MPI_Irecv(&question_buffer_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQuestionTag, watch_comm_,
              &question_);
  }
}

void MpiCommunicator::watchdog_loop() {
  std::unique_lock<std::mutex> lock(watch_mutex_);
  while (!watch_wake_.wait_for(lock, kWatchdogPoll, [this] { return watch_stopping_; })) {
    lock.unlock();
    // No MPI call here in normal operation: Open MPI 4.1.4's shared-memory transport crashed
    // (SIGSEGV in mca_btl_vader_poll_handle_frag, ctest netns_two_hosts) when this thread
    // polled every 100 ms while the workers made their calls. Questions are answered only by
    // ranks whose own watchdog has fired (timed_out).
    WorkerState state;
    {
      std::lock_guard<std::mutex> guard(state_mutex_);
      state = state_;
    }
    if (state.in_collective) {
      const auto now = Clock::now();
      if (now - state.entered > options_.timeout) timed_out(state, /*after_stop=*/false);
      // A stop signal that arrived while this collective was running (so less time ago than
      // the worker entered it), stop_grace ago or longer (see the header).
      const double since_stop = seconds_since_stop_signal();
      const double in_it = std::chrono::duration<double>(now - state.entered).count();
      const auto grace = static_cast<double>(options_.stop_grace.count());
      if (grace > 0 && since_stop > grace && since_stop < in_it) timed_out(state, /*after_stop=*/true);
    }
    lock.lock();
  }
}

void MpiCommunicator::timed_out(const WorkerState& state, bool after_stop) {
  // Ask every other rank what its worker is doing; the watchdogs of live ranks answer within
  // 100 ms, whatever their workers do. Best effort: MPI errors here only mean no answer.
  const int64_t question = state.seq;
  std::vector<int64_t> answers(static_cast<size_t>(3) * size_, -1);
  std::vector<MPI_Request> receives(size_, MPI_REQUEST_NULL), sends(size_, MPI_REQUEST_NULL);
  std::vector<bool> answered(size_, false);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Irecv(&answers[3 * r], 3, MPI_INT64_T, r, kAnswerTag, watch_comm_, &receives[r]);
    MPI_Isend(&question, 1, MPI_INT64_T, r, kQuestionTag, watch_comm_, &sends[r]);
  }
  const auto answer_wait = std::min<Clock::duration>(kAnswerWait, options_.timeout);
  const auto give_up = Clock::now() + answer_wait;
  int missing = size_ - 1;
  while (missing > 0 && Clock::now() < give_up) {
    answer_questions();  // another rank that timed out is asking this one
    for (int r = 0; r < size_; ++r) {
      if (receives[r] == MPI_REQUEST_NULL || answered[r]) continue;
      int done = 0;
      if (MPI_Test(&receives[r], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        answered[r] = true;
        --missing;
      }
    }
    if (missing > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  const std::string seconds =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(answer_wait).count());
  std::vector<std::string> never_arrived, waiting, elsewhere;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::string who = "rank " + std::to_string(r);
    if (!answered[r]) {
      never_arrived.push_back(who + " (no answer within " + seconds +
                              " s: stopped, dead, or its process hangs)");
      continue;
    }
    const int64_t seq = answers[3 * r], in_it = answers[3 * r + 1], kind = answers[3 * r + 2];
    const std::string its = std::string(detail::kind_name(kind)) + " #" + std::to_string(seq);
    if (seq < state.seq) {
      never_arrived.push_back(who + (in_it ? " (still in " + its + ")"
                                           : seq == 0 ? " (has called no collective yet)"
                                                      : " (idle after " + its +
                                                            ": its program has not called #" +
                                                            std::to_string(state.seq) + " yet)"));
    } else if (seq == state.seq && kind == state.kind) {
      waiting.push_back(std::to_string(r));
    } else {
      elsewhere.push_back(who + " is in " + its +
                          " (the ranks call different collectives; DDP_DEBUG=DETAIL checks each)");
    }
  }
  const std::string why =
      after_stop
          ? " unfinished " + std::to_string(options_.stop_grace.count()) + " s after " +
                stop_signal_name(stop_signal()) + " arrived while rank " + std::to_string(rank_) +
                " was in it, so no rank can reach the step boundary where it would stop "
                "(MpiOptions::stop_grace). Ranks that never arrived: "
          : " unfinished " + std::to_string(options_.timeout.count()) + " s after rank " +
                std::to_string(rank_) +
                " entered it (MpiOptions::timeout: --timeout, DDP_TIMEOUT_SECONDS). Ranks that "
                "never arrived: ";
  std::string message = "MPI watchdog on rank " + std::to_string(rank_) + ": " +
                        state.task->what() + why +
                        (never_arrived.empty() ? std::string("none") : join(never_arrived));
  if (!elsewhere.empty()) message += "; " + join(elsewhere);
  if (!waiting.empty()) message += "; waiting in it too: rank(s) " + join(waiting);
  if (never_arrived.empty() && elsewhere.empty()) {
    message += " (every rank is in it: the transfer itself hangs, e.g. a rank stopped in the "
               "middle of it, or the network)";
  }
  message += ". Ending the job.";
  if (options_.on_fatal_error) options_.on_fatal_error(message);
  std::fprintf(stderr, "ddp: rank %d: %s\n", rank_, message.c_str());
  std::fflush(stderr);
  std::abort();
}

MpiOptions::Sockets parse_sockets(const std::string& name, const std::string& what) {
  for (auto sockets : {MpiOptions::Sockets::Auto, MpiOptions::Sockets::Never, MpiOptions::Sockets::Always}) {
    if (name == to_string(sockets)) return sockets;
  }
  throw std::invalid_argument(what + "='" + name + "': expected auto, never or always");
}

const char* to_string(MpiOptions::Sockets sockets) {
  switch (sockets) {
    case MpiOptions::Sockets::Auto: return "auto";
    case MpiOptions::Sockets::Never: return "never";
    case MpiOptions::Sockets::Always: return "always";
  }
  return "?";
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
  const std::size_t max_bytes = options_.max_message_bytes;
  const bool blocking = host.nbytes() >= options_.blocking_bytes;
  const bool ring = use_sockets_ && host.nbytes() >= options_.socket_bytes;
  // The debug mode's all-gather already waits for every rank; the ring sleeps in poll().
  const bool arrival_barrier = blocking && !ring && !options_.check_collectives;
  auto task = std::make_shared<detail::MpiTask>(detail::kAllReduce, tensor, static_cast<int64_t>(op));
  task->run = [this, host, type, mpi_reduce_op, op, comm, size, max_bytes, blocking, ring,
               arrival_barrier] {
    if (ring) {
      if (!ring_) {
        ring_ = std::make_unique<detail::SocketRing>(comm, options_.socket_interfaces, single_host_);
        if (rank_ == 0) {  // once per communicator: where the gradients now travel
          std::fprintf(stderr,
                       "ddp: socket ring: all-reduces of %zu KiB or more go over TCP between the "
                       "%d ranks (rank 0 at %s; DDP_MPI_SOCKETS=never keeps them on MPI)\n",
                       options_.socket_bytes >> 10, size, ring_->address().c_str());
          std::fflush(stderr);
        }
      }
      ring_->all_reduce(host, op);
      if (op == ReduceOp::Avg) host.div_(size);
      return;
    }
    if (arrival_barrier) {
      MPI_Request request;
      DDP_MPI_CHECK(MPI_Ibarrier(comm, &request));
      wait_for(request);
    }
    for_each_chunk(host, max_bytes, [&](void* data, int count) {
      if (blocking) {
        DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, mpi_reduce_op, comm));
        return;
      }
      MPI_Request request;
      DDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_reduce_op, comm, &request));
      wait_for(request);
    });
    if (op == ReduceOp::Avg) host.div_(size);
  };
  return std::make_unique<MpiWork>(submit(std::move(task)), tensor, host);
}

void MpiCommunicator::broadcast(const torch::Tensor& tensor, int root) {
  check_contiguous(tensor, "MpiCommunicator::broadcast");
  const MPI_Datatype type = mpi_type(tensor);
  const torch::Tensor host = on_host(tensor);
  const MPI_Comm comm = comm_;
  auto task = std::make_shared<detail::MpiTask>(detail::kBroadcast, tensor, root);
  task->run = [this, host, type, root, comm] {
    for_each_chunk(host, 0, [&](void* data, int count) {
      MPI_Request request;
      DDP_MPI_CHECK(MPI_Ibcast(data, count, type, root, comm, &request));
      wait_for(request);
    });
  };
  MpiWork(submit(std::move(task)), tensor, host).wait();
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
  auto task = std::make_shared<detail::MpiTask>(detail::kAllGather, tensor, -1);
  task->run = [this, host, out, comm] {
    const int count = static_cast<int>(host.numel());
    const MPI_Datatype type = mpi_type(host);
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Iallgather(host.data_ptr(), count, type, out.data_ptr(), count, type, comm,
                                 &request));
    wait_for(request);
  };
  MpiWork(submit(std::move(task))).wait();
  return out.to(tensor.device());
}

void MpiCommunicator::barrier() {
  const MPI_Comm comm = comm_;
  auto task = std::make_shared<detail::MpiTask>(detail::kBarrier, torch::Tensor(), -1);
  task->run = [this, comm] {
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ibarrier(comm, &request));
    wait_for(request);
  };
  MpiWork(submit(std::move(task))).wait();
}

}  // namespace ddp

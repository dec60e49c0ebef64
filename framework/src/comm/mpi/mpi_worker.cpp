#include "comm/mpi/mpi_worker.h"

#include "util/mpi_check.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

// A collective unfinished this long asks whether the ranks are stuck in different collectives
// (check_deadlock), then again after twice as long, and so on. A rank waiting in a collective
// answers within a few milliseconds (its sleeps are at most WorkerOptions::max_sleep), so a short
// answer wait suffices; a rank that does not answer is busy elsewhere and decides nothing.
constexpr auto kFirstDeadlockCheck = std::chrono::seconds(5);
constexpr auto kDeadlockAnswerWait = std::chrono::milliseconds(200);
constexpr auto kDeadlockSettle = std::chrono::seconds(1);

struct MpiTask {
  Collective call;            // seq set by submit()
  int64_t ticket = 0;         // its place in the debug mode's check, set by submit()
  std::function<void()> run;  // made on the worker thread
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  Work::Span span{};
};

namespace {

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<MpiTask> task, torch::Tensor target, torch::Tensor host)
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
  std::optional<Span> host_span() const override {
    std::lock_guard<std::mutex> lock(task_->mutex);
    if (!task_->done) return std::nullopt;
    return task_->span;
  }

 private:
  std::shared_ptr<MpiTask> task_;
  torch::Tensor target_, host_;
};

// The worker whose thread this is and the call it runs, while it runs one (RunningCall): what
// MpiWorker::failing_call_message() names.
thread_local const MpiWorker* t_worker = nullptr;
thread_local const Collective* t_call = nullptr;

class RunningCall {
 public:
  RunningCall(const MpiWorker* worker, const Collective* call) {
    t_worker = worker;
    t_call = call;
  }
  ~RunningCall() {
    t_worker = nullptr;
    t_call = nullptr;
  }
  RunningCall(const RunningCall&) = delete;
  RunningCall& operator=(const RunningCall&) = delete;
};

}  // namespace

torch::Tensor on_host(const torch::Tensor& tensor) {
  return tensor.is_cpu() ? tensor : tensor.to(torch::kCPU);
}

std::function<void()> fill_on_worker(const torch::Tensor& tensor, std::function<void()> fill) {
  if (!fill || tensor.is_cpu()) return fill;
  fill();
  return {};
}

MpiWorker::MpiWorker(MPI_Comm comm, WorkerOptions options) : options_(std::move(options)) {
  int level = MPI_THREAD_SINGLE;
  DDP_MPI_CHECK(MPI_Query_thread(&level));
  if (level < MPI_THREAD_MULTIPLE) {
    throw std::runtime_error(
        "MpiCommunicator: MPI provides thread level " + std::to_string(level) +
        ", but the communicator makes its MPI calls on a worker thread of its own and needs "
        "MPI_THREAD_MULTIPLE (" +
        std::to_string(MPI_THREAD_MULTIPLE) +
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
  DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  if (options_.check_collectives) {
    check_ = options_.check ? options_.check : std::make_shared<CollectiveCheck>(comm_);
    member_ = check_->join(options_.name);
  }
  inquiry_ = options_.inquiry ? options_.inquiry : std::make_shared<Inquiry>(comm_);
  inquiry_member_ = inquiry_->join(options_.name, [this] { return report(); });
  watchdog_ = std::make_unique<MpiWatchdog>(
      options_, [this] { return state(); }, inquiry_, inquiry_member_);
  thread_ = std::thread([this] { loop(); });
}

MpiWorker::~MpiWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();     // the queued collectives finish under the watchdog
  watchdog_.reset();  // then the watchdog stops
  inquiry_->leave(inquiry_member_);
  if (!mpi_finalized() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<Work> MpiWorker::submit(Collective call, std::function<void()> run,
                                        torch::Tensor target, torch::Tensor host) {
  auto task = std::make_shared<MpiTask>();
  task->call = std::move(call);
  task->run = std::move(run);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task->call.seq = ++submitted_;
    // Under this lock: the tickets of one worker follow its queue (collective_check.h).
    if (check_) task->ticket = check_->take_ticket();
    queue_.push_back(task);
  }
  wake_.notify_one();
  return std::make_unique<MpiWork>(std::move(task), std::move(target), std::move(host));
}

void MpiWorker::wait(MPI_Request& request, bool spin) const {
  int done = 0;
  DDP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  if (done) return;
  // Open MPI moves a collective along only inside MPI calls: while every rank is there, testing
  // without pause is what keeps it fast. Past `spin`, a peer is late (or stopped, or dead), and
  // sleeping between tests frees the core; the sleep doubles so a long wait costs a few
  // wake-ups per second per millisecond of max_sleep, while a peer arriving soon is noticed soon.
  const auto start = Clock::now();
  const auto spin_until = start + (spin ? options_.spin : std::chrono::microseconds(0));
  const bool may_sleep = options_.max_sleep.count() > 0;
  std::chrono::microseconds sleep(20);
  auto check_every = kFirstDeadlockCheck;
  auto next_check = start + check_every;
  for (;;) {
    DDP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (may_sleep && Clock::now() >= spin_until) {
      inquiry_->answer();  // a peer whose collective failed or hung may be asking
      std::this_thread::sleep_for(std::min(sleep, options_.max_sleep));
      if (sleep < options_.max_sleep) sleep *= 2;
      if (Clock::now() >= next_check) {
        if (check_deadlock(request)) return;  // it finished meanwhile
        check_every *= 2;
        next_check = Clock::now() + check_every;
      }
    }
  }
}

namespace {

// Whether `reports` show a collective that cannot finish: every other rank answered, some rank
// is not in `mine` (the worker `member`'s current call), and every such rank is in another
// collective, where it waits for a rank that is not there.
bool stalled(const std::vector<RankReport>& reports, int self, int member,
             const Collective::Fingerprint& mine) {
  bool missing = false;
  for (int r = 0; r < static_cast<int>(reports.size()); ++r) {
    if (r == self) continue;
    if (!reports[r].answered) return false;
    if (reports[r].in(member, mine)) continue;
    if (reports[r].calls.empty()) return false;  // in none: its program may yet call it
    missing = true;
  }
  return missing;
}

bool same_reports(const std::vector<RankReport>& a, const std::vector<RankReport>& b) {
  if (a.size() != b.size()) return false;
  for (size_t r = 0; r < a.size(); ++r) {
    if (a[r].answered != b[r].answered || a[r].calls.size() != b[r].calls.size()) return false;
    for (size_t i = 0; i < a[r].calls.size(); ++i) {
      const CallReport &x = a[r].calls[i], &y = b[r].calls[i];
      if (x.member != y.member || x.seq != y.seq || x.fingerprint != y.fingerprint) return false;
    }
  }
  return true;
}

}  // namespace

bool MpiWorker::check_deadlock(MPI_Request& request) const {
  const WorkerState now = state();
  if (!now.call) return false;
  const Collective::Fingerprint mine = now.call->fingerprint();
  const auto first = inquiry_->ask(kDeadlockAnswerWait);
  if (!stalled(first, rank_, inquiry_member_, mine)) return false;
  // Stable for a while (no rank moved on), or it was a moment between two calls.
  const auto until = Clock::now() + kDeadlockSettle;
  while (Clock::now() < until) {
    int done = 0;
    DDP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return true;
    inquiry_->answer();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto second = inquiry_->ask(kDeadlockAnswerWait);
  if (!stalled(second, rank_, inquiry_member_, mine) || !same_reports(first, second)) return false;
  std::string others;
  for (int r = 0; r < static_cast<int>(second.size()); ++r) {
    if (r == rank_) continue;
    others += (others.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " is in " +
              describe_calls(*inquiry_, second[r]);
  }
  throw CollectivesDiffer(
      "rank " + std::to_string(rank_) + ": " + now.call->describe() + " on " +
      inquiry_->name(inquiry_member_) +
      " cannot finish: the ranks call different collectives, "
      "and none has moved on for " +
      std::to_string(
          std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - now.entered).count()) +
      " s: " + others + ". " + mismatch_cause());
}

WorkerState MpiWorker::state() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return state_;
}

CallReport MpiWorker::report() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  CallReport report;
  report.seq = state_.seq;
  report.in_collective = state_.in_collective && state_.call;
  if (report.in_collective) report.fingerprint = state_.call->fingerprint();
  return report;
}

std::exception_ptr MpiWorker::named_failure(const Collective& call, const std::exception& error) {
  // A communicator made alone: the error as it is (failure_message asks nothing there).
  if (!options_.inquiry) return std::make_exception_ptr(std::runtime_error(error.what()));
  return std::make_exception_ptr(std::runtime_error(failure_message(call, error.what())));
}

std::string MpiWorker::failure_message(const Collective& call, const std::string& error) const {
  std::string message = "rank " + std::to_string(rank_) + ": " + call.describe() + " on " +
                        inquiry_->name(inquiry_member_) + " failed: " + error;
  // A communicator made alone has an Inquiry of its own, which a peer may already have freed
  // with its communicator (a ring closed by its owner): a question sent there stays unmatched,
  // and Open MPI may deliver it to the next communicator that reuses the context id. Only a
  // process group's Inquiry lives as long as the group.
  if (!options_.inquiry) return message;
  const std::vector<RankReport> reports = inquiry_->ask(Inquiry::kAnswerWait);
  const Collective::Fingerprint mine = call.fingerprint();
  std::string others;
  bool differ = false;
  for (int r = 0; r < static_cast<int>(reports.size()); ++r) {
    if (r == rank_) continue;
    others += others.empty() ? "" : "; ";
    others += "rank " + std::to_string(r);
    if (!reports[r].answered) {
      others += ": no answer within 2 s (stopped, dead, or in no collective)";
      differ = true;
      continue;
    }
    differ = differ || !reports[r].in(inquiry_member_, mine);
    others += reports[r].calls.empty() ? " is in no collective"
                                       : " is in " + describe_calls(*inquiry_, reports[r]);
  }
  if (!others.empty()) message += ". The other ranks: " + others;
  if (differ) message += std::string(". ") + mismatch_cause();
  return message;
}

std::string MpiWorker::failing_call_message(const std::string& error) {
  if (!t_worker || !t_call) return "";
  return t_worker->failure_message(*t_call, error);
}

void MpiWorker::loop() {
  for (;;) {
    std::shared_ptr<MpiTask> task;
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
      state_.seq = task->call.seq;
      state_.in_collective = true;
      state_.call = std::shared_ptr<const Collective>(task, &task->call);  // for the watchdog
      state_.entered = Clock::now();
    }
    std::exception_ptr error;
    {
      const RunningCall running(this, &task->call);
      try {
        const auto wait_for = [this](MPI_Request& r) { wait(r); };
        if (check_) {
          check_->check(task->ticket, member_, task->call, wait_for);
        } else {
          agree_on_call(comm_, task->call, inquiry_->name(inquiry_member_), wait_for);
        }
      } catch (...) {
        error = std::current_exception();  // the checks' own errors name both sides
      }
      if (!error) {
        try {
          task->run();
        } catch (const CollectivesDiffer&) {
          error = std::current_exception();  // names every side already
        } catch (const std::exception& e) {
          error = named_failure(task->call, e);
        } catch (...) {
          error = std::current_exception();
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      state_.in_collective = false;
      state_.call = nullptr;
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

}  // namespace ddp::detail

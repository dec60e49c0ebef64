#include "runtime/phase_watchdog.h"

#include <ddp/runtime.h>

#include "util/clock.h"
#include "util/environment.h"
#include "util/host_name.h"
#include "util/testing_hooks.h"

#include <mpi.h>

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <mutex>
#include <thread>

namespace ddp {

namespace {

constexpr auto kPoll = std::chrono::milliseconds(200);
// WatchedPhase's slack: a collective inside the phase is named by its own watchdog first.
constexpr std::chrono::seconds kCollectiveFirst{5};

struct Phase {
  std::string what, why, limit;
  std::chrono::seconds timeout, slack;
  Clock::time_point last_progress;
  uint64_t parent = 0;  // the enclosing phase of the same thread, 0: none
  int children = 0;     // live phases inside it (it is not watched while > 0)
};

// The process's phases and the thread that watches them. Never destroyed: a phase may end
// during static destruction, and a process that exits with phases alive must not join here.
class PhaseWatchdog {
 public:
  static PhaseWatchdog& get() {
    static PhaseWatchdog* watchdog = new PhaseWatchdog();
    return *watchdog;
  }

  uint64_t enter(Phase phase) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t id = ++last_id_;
    phase.parent = current_;
    phase.last_progress = Clock::now();
    if (current_ != 0) ++phases_.at(current_).children;
    phases_.emplace(id, std::move(phase));
    current_ = id;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    wake_.notify_all();
    return id;
  }

  void leave(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = phases_.find(id);
    if (it == phases_.end()) return;
    const uint64_t parent = it->second.parent;
    phases_.erase(it);
    current_ = parent;
    if (parent != 0) {
      Phase& enclosing = phases_.at(parent);
      --enclosing.children;
      enclosing.last_progress = Clock::now();  // its clock restarts
    }
  }

  void progress(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = phases_.find(id);
    if (it != phases_.end()) it->second.last_progress = Clock::now();
  }

  void set_identity(int rank, const std::string& host) {
    std::lock_guard<std::mutex> lock(mutex_);
    rank_ = rank;
    if (!host.empty()) host_ = host;
  }

  int rank() {
    std::lock_guard<std::mutex> lock(mutex_);
    return rank_;
  }

  std::atomic<bool> mpi_ready{false};
  std::atomic<int64_t> default_timeout_seconds{0};  // 0: not set yet

 private:
  PhaseWatchdog() : host_(detail::host_name("?")) {}

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (phases_.empty()) {
        wake_.wait(lock, [this] { return !phases_.empty(); });
      } else {
        wake_.wait_for(lock, kPoll);
      }
      const auto now = Clock::now();
      for (const auto& [id, phase] : phases_) {
        if (phase.children == 0 && now - phase.last_progress > phase.timeout + phase.slack) {
          fire(id, now);  // does not return
        }
      }
    }
  }

  // Called with the lock held: says which phase, and ends the job.
  [[noreturn]] void fire(uint64_t id, Clock::time_point now) {
    const Phase& phase = phases_.at(id);
    std::string where = phase.what;
    for (uint64_t up = phase.parent; up != 0; up = phases_.at(up).parent) {
      where += ", in " + phases_.at(up).what;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - phase.last_progress);
    const std::string line =
        "ddp: rank " + (rank_ >= 0 ? std::to_string(rank_) : std::string("?")) + " (" + host_ +
        "): watchdog: " + where + " unfinished after " + std::to_string(waited.count()) +
        " s (limit " + std::to_string(phase.timeout.count()) + " s: " + phase.limit + ")" +
        (phase.why.empty() ? "" : ": " + phase.why) + ". Ending the job.\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
    int finalized = 1;
    if (mpi_ready && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) {
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // Before MPI is up there is no MPI_Abort: this process ends, and the launcher (mpirun,
    // srun --kill-on-bad-exit) ends the others, which wait for it in MPI_Init.
    std::_Exit(1);
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Phase> phases_;
  uint64_t last_id_ = 0;
  static thread_local uint64_t current_;
  std::thread thread_;
  int rank_ = -1;
  std::string host_;
};

thread_local uint64_t PhaseWatchdog::current_ = 0;

std::chrono::seconds phase_timeout() {
  const int64_t set = PhaseWatchdog::get().default_timeout_seconds;
  return std::chrono::seconds(set > 0 ? set : collective_timeout_seconds(current_environment()));
}

constexpr const char* kPhaseTimeoutSource =
    "ProcessGroupOptions::timeout, --timeout, DDP_TIMEOUT_SECONDS";

}  // namespace

namespace detail {

void set_phase_identity(int rank, const std::string& host) {
  PhaseWatchdog::get().set_identity(rank, host);
}

void set_phase_mpi_ready(bool ready) { PhaseWatchdog::get().mpi_ready = ready; }

uint64_t enter_phase(const std::string& what, const std::string& why, std::chrono::seconds timeout,
                     const std::string& limit, std::chrono::seconds slack) {
  const uint64_t id = PhaseWatchdog::get().enter(Phase{what, why, limit, timeout, slack, {}, 0, 0});
  if (const auto& entered = testing::hooks().entered_phase)
    entered(PhaseWatchdog::get().rank(), what);
  return id;
}

void leave_phase(uint64_t id) { PhaseWatchdog::get().leave(id); }

ScopedPhase startup_phase(const std::string& what, const std::string& why,
                          std::chrono::seconds timeout) {
  if (timeout.count() > 0) {
    return ScopedPhase(what, why, timeout, "RuntimeOptions::startup_timeout, --timeout",
                       std::chrono::seconds(0));
  }
  return ScopedPhase(what, why,
                     std::chrono::seconds(startup_timeout_seconds(current_environment())),
                     "DDP_STARTUP_TIMEOUT_SECONDS", std::chrono::seconds(0));
}

ScopedPhase setup_phase(const std::string& what, const std::string& why) {
  return ScopedPhase(what, why, phase_timeout(), kPhaseTimeoutSource, std::chrono::seconds(0));
}

}  // namespace detail

WatchedPhase::WatchedPhase(const std::string& what, std::chrono::seconds timeout)
    : id_(detail::enter_phase(what, "", timeout.count() > 0 ? timeout : phase_timeout(),
                              timeout.count() > 0 ? "the WatchedPhase's own" : kPhaseTimeoutSource,
                              kCollectiveFirst)) {}

WatchedPhase::~WatchedPhase() { detail::leave_phase(id_); }

void WatchedPhase::progress() { PhaseWatchdog::get().progress(id_); }

void set_phase_timeout(std::chrono::seconds timeout) {
  if (timeout.count() <= 0) {
    throw std::invalid_argument("set_phase_timeout: the timeout must be > 0 s, got " +
                                std::to_string(timeout.count()));
  }
  PhaseWatchdog::get().default_timeout_seconds = timeout.count();
}

}  // namespace ddp

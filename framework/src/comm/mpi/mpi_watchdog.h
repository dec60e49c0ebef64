#pragma once
// The watchdog of a worker that runs collectives on the host (mpi_worker.h): a sleeping thread,
// waking every 100 ms, making no MPI call in normal operation. When a collective is still
// unfinished WatchdogOptions::timeout after this rank entered it, it calls
// WatchdogOptions::on_fatal_error with a message naming the collective (collective.h), this rank
// and what every other rank is in, asked through the worker's Inquiry (inquiry.h; a rank that
// does not answer within 2 s is stopped, dead, hung, or in no collective).
//
// Stop signals (<ddp/stop_signal.h>): a rank stuck in a collective whose peer is dead never
// reaches the step boundary where it would stop, and Slurm kills it KillWait later without a
// word. So a collective already running when the signal came and still unfinished
// WatchdogOptions::stop_grace after it ends the job the same way, saying the signal could not be
// honoured. The stop's own collectives (entered after the signal) keep the full timeout.

#include "comm/collective.h"
#include "comm/mpi/inquiry.h"

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ddp {

struct WatchdogOptions {
  // A collective unfinished this long after this rank entered it ends the job (PyTorch's
  // default, 10 minutes).
  std::chrono::seconds timeout{600};
  // A collective entered before a stop signal and unfinished this long after it ends the job.
  // 0: only the timeout. Must stay inside Slurm's KillWait (30 s by default).
  std::chrono::seconds stop_grace{10};
  // Called on the watchdog thread with the message; must not return (end the process or the
  // job). Unset: the message goes to stderr and the process calls std::abort().
  std::function<void(const std::string&)> on_fatal_error;
  // The debug mode: the worker checks that every rank calls the same collective before it runs
  // it (mpi_worker.h).
  bool check_collectives = false;
};

namespace detail {

// What a rank's worker is doing, for the watchdog and for the other ranks' questions.
struct WorkerState {
  int64_t seq = 0;  // the last collective the worker entered (0: none yet)
  bool in_collective = false;
  std::shared_ptr<const Collective> call;  // the collective it is in, if any
  std::chrono::steady_clock::time_point entered{};
};

class MpiWatchdog {
 public:
  // Watches what `state` returns (called every 100 ms on the watchdog thread; must be cheap and
  // thread-safe); asks the other ranks through `inquiry`, where the worker is `member`.
  MpiWatchdog(WatchdogOptions options, std::function<WorkerState()> state,
              std::shared_ptr<Inquiry> inquiry, int member);
  // Stops the thread. Destroy it after the worker has stopped.
  ~MpiWatchdog();
  MpiWatchdog(const MpiWatchdog&) = delete;
  MpiWatchdog& operator=(const MpiWatchdog&) = delete;

 private:
  void loop();
  // `after_stop`: ended by stop_grace after a stop signal, not by the timeout.
  [[noreturn]] void timed_out(const WorkerState& state, bool after_stop);

  WatchdogOptions options_;
  std::function<WorkerState()> state_;
  std::shared_ptr<Inquiry> inquiry_;
  int member_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace detail
}  // namespace ddp

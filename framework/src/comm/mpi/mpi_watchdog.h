#pragma once
// The watchdog of a worker that runs collectives on the host (comm/mpi/mpi_worker.h: the MPI
// backend's, and the TCP ring's, which shares it inside ProcessGroup's CPU communicator).
//
// A thread per worker, asleep, waking every 100 ms, making no MPI call in normal operation. It
// ends the job when a collective is still unfinished WatchdogOptions::timeout after the worker
// entered it: it calls WatchdogOptions::on_fatal_error (ProcessGroup passes Runtime::abort) with
// a message naming the collective (comm/collective.h: kind, its sequence number on the
// communicator, counting every kind, dtype and shape), this rank, and what every other rank is
// in, which it asks through the worker's Inquiry (comm/mpi/inquiry.h), waiting up to 2 s: a rank
// waiting in a collective of this process group answers with it (so a rank in another
// collective, on this communicator or another of the group, is named with its call), and a rank
// that does not answer is stopped, dead, hung, or alive but in no collective (its program is
// elsewhere). The ranks are those of the communicator (ProcessGroup's are duplicates of
// MPI_COMM_WORLD, so these are the world ranks). The timeout counts from when this rank entered
// the collective, not from when it was queued.
//
// Stop signals (<ddp/stop_signal.h>): a program that stops on SIGTERM stops at its next step
// boundary, which a rank stuck in a collective whose peer is dead or hung never reaches (Slurm's
// time limit while a rank hangs; `srun --kill-on-bad-exit`'s SIGTERM to the survivors of a
// crash), and Slurm kills it only KillWait (30 s) later, without a word. So a collective that was
// already running when the stop signal came and is still unfinished WatchdogOptions::stop_grace
// after it ends the job the same way, the message saying that the signal could not be honoured.
// The collectives of the stop itself (entered after the signal: the agreement, the snapshot)
// keep the full timeout.

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
  // A collective unfinished this long after this rank entered it ends the job. PyTorch's
  // default, 10 minutes. ProcessGroup: ProcessGroupOptions::timeout, else DDP_TIMEOUT_SECONDS.
  std::chrono::seconds timeout{600};
  // A collective entered before a stop signal and unfinished this long after it ends the job.
  // 0: only the timeout. 10 s: inside Slurm's default KillWait of 30 s, and far longer than one
  // collective of a healthy job takes.
  std::chrono::seconds stop_grace{10};
  // Called on the watchdog thread with the message; must not return (end the process or the
  // job). Unset: the message goes to stderr and the process calls std::abort().
  std::function<void(const std::string&)> on_fatal_error;
  // The debug mode (DDP_DEBUG=DETAIL): the worker checks that every rank calls the same
  // collective before it runs it (comm/mpi/mpi_worker.h), which also names a rank that called a
  // collective while the others are in none.
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

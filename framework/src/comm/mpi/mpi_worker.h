#pragma once
// The thread that makes a host communicator's collectives: MpiCommunicator's, and the TCP
// ring's (comm/ring/socket_ring.h). As c10d's ProcessGroupMPI does, the communicator queues each
// call here and the worker runs them one at a time, in the order they were queued: an
// all_reduce_async() returns at once and the worker reduces while the caller computes, and the
// blocking collectives queue behind it and wait. So the order of collectives is the order of
// the calls (communicator.h), also for two communicators that share one worker
// (ProcessGroup's CPU communicator: MPI and the ring, comm/compose/cpu_communicator.h).
//
// It owns a duplicate of the communicator it is given (MPI_ERRORS_RETURN), for the collectives
// it runs, so their messages never match the application's own MPI traffic, nor another
// worker's (each worker thread then has a communicator of its own, which MPI needs for
// concurrent collectives); and the watchdog (comm/mpi/mpi_watchdog.h), which watches what the
// worker is in. Needs MPI_THREAD_MULTIPLE (the worker and the caller's other MPI calls run at
// once); the constructor throws std::runtime_error saying so when MPI provides less.
//
// Errors: what a queued call throws (a failing MPI call: MPI's message, the call and file:line,
// util/mpi_check.h) is rethrown by Work::wait() on the caller's thread; on a communicator of a
// ProcessGroup (WorkerOptions::inquiry given) with what the other ranks are in (comm/mpi/inquiry.h:
// the worker asks them first, up to 2 s), so that a collective
// called by some ranks only (MPI_ERR_TRUNCATE) is named on both sides, e.g. "rank 1:
// all_reduce #62 float32[2570] (sum) on communicator 3 (DistributedDataParallel's gradient
// communicator) failed: ...; rank 0 is in broadcast #62 float32[4] (root 0) on communicator 3
// (...)", with the likely cause.
//
// A failed collective's request that Open MPI reports through MPI_COMM_WORLD's error handler
// instead (the truncation of a non-blocking collective, in MPI_Test): that handler
// (runtime.cpp) names it the same way, from the worker's thread, through
// failing_call_message(), and ends the job.
//
// Stuck in different collectives: a wait unfinished after 5 s asks the other ranks (comm/
// inquiry.h; again after 10, 20, ... s). When every other rank answers, none has moved on in a
// second, and a rank missing from this collective is waiting in another one (which therefore
// waits for a rank that is here), no collective can finish: the call fails with
// CollectivesDiffer naming every rank's call and the likely cause, long before the watchdog's
// timeout. A rank that does not answer (computing, stopped, dead) decides nothing: the timeout
// stays the limit then.
//
// Waiting (wait()): a collective is a non-blocking MPI call that the worker tests. For the first
// WorkerOptions::spin of a wait it tests without pause (what a blocking call does, so a
// collective whose peers are there costs the same); after that it sleeps between tests, 20 us at
// first, doubling up to WorkerOptions::max_sleep: a rank waiting for a peer that is late,
// stopped or dead no longer burns a core. Between those sleeps it answers the other ranks'
// questions (comm/mpi/inquiry.h).
//
// Debug mode (WorkerOptions::check_collectives; ProcessGroup sets it from DDP_DEBUG=DETAIL):
// before each collective the ranks all-gather its fingerprint (comm/mpi/collective_check.h), over
// WorkerOptions::check, which the communicators of one ProcessGroup share. When any rank
// differs, every rank's Work::wait() throws the same error naming both sides, e.g. "rank 0
// called all_reduce #12 float32[10] (sum) but rank 1 called broadcast #12 int64[3] (root 0)",
// and no rank runs the collective. It costs one small all-gather per collective.

#include "comm/collective.h"
#include "comm/mpi/collective_check.h"
#include "comm/mpi/inquiry.h"
#include "comm/mpi/mpi_watchdog.h"

#include <ddp/communicator.h>

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace ddp {

struct WorkerOptions : WatchdogOptions {
  // How the worker waits for a collective (see above): busy-testing for `spin`, then sleeping
  // between tests, the sleeps doubling from 20 us up to `max_sleep`. `spin` 0: sleep at once;
  // `max_sleep` 0: never sleep (a core per waiting rank, as a blocking MPI call). ProcessGroup
  // reads DDP_MPI_SPIN_US and DDP_MPI_MAX_SLEEP_US.
  std::chrono::microseconds spin{1000};
  std::chrono::microseconds max_sleep{2000};
  // check_collectives (before each collective, check that every rank calls the same one: the
  // debug mode, above) is WatchdogOptions', whose messages suggest it while it is off.
  // With check_collectives: the check this worker's calls go through, shared with the other
  // communicators of its ProcessGroup; unset: the worker makes one of its own (collective).
  std::shared_ptr<detail::CollectiveCheck> check;
  // Where a failed or hung collective asks what the other ranks are in (comm/mpi/inquiry.h), shared
  // with the other communicators of its ProcessGroup; unset: the worker makes one of its own
  // (collective).
  std::shared_ptr<detail::Inquiry> inquiry;
  // How messages name this communicator ("ProcessGroup::cpu()"; "": by number).
  std::string name;
};

namespace detail {

struct MpiTask;  // one queued collective: what it is, what to run, and its outcome

// The ranks wait in different collectives, none of which can finish: what() names each rank's.
struct CollectivesDiffer : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class MpiWorker {
 public:
  // Collective over `comm` (two MPI_Comm_dup: the worker's, the watchdog's).
  MpiWorker(MPI_Comm comm, WorkerOptions options);
  // Finishes the queued collectives (still under the watchdog), joins the worker and the
  // watchdog and frees the duplicates.
  ~MpiWorker();
  MpiWorker(const MpiWorker&) = delete;
  MpiWorker& operator=(const MpiWorker&) = delete;

  // The duplicate the queued calls communicate over; theirs alone, on the worker thread.
  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const WorkerOptions& options() const { return options_; }

  // Queues `call` (numbered here: its `seq`), whose `run` the worker makes. `host`, when given,
  // is a host copy of `target` (a GPU tensor) that `run` writes: Work::wait() copies it back.
  std::unique_ptr<Work> submit(Collective call, std::function<void()> run,
                               torch::Tensor target = {}, torch::Tensor host = {});

  // Waits for `request` as described above (spin, then sleeps). Worker thread only. `spin`
  // false: sleeps from the start, for waits on a peer that is busy elsewhere (the hierarchical
  // all-reduce's host phases: comm/compose/hierarchical_communicator.h), where spinning takes the
  // core that peer's training needs. Throws CollectivesDiffer when the ranks are stuck in different
  // collectives (below).
  void wait(MPI_Request& request, bool spin = true) const;

  // For MPI_COMM_WORLD's error handler: when the calling thread is a worker running a
  // collective, the message a failed run of it gets (below: named_failure), for `error` (MPI's
  // text), asking the other ranks when it is a process group's; "" on any other thread.
  static std::string failing_call_message(const std::string& error);

 private:
  void loop();
  WorkerState state() const;
  CallReport report() const;  // state() as the Inquiry reports it
  // Inside wait(), from 5 s on: asks the other ranks, and throws CollectivesDiffer when they are
  // stuck in other collectives (twice the same answers, 1 s apart); true when `request` finished
  // meanwhile.
  bool check_deadlock(MPI_Request& request) const;
  // The error of `call`'s failed run, with what the other ranks are in.
  std::exception_ptr named_failure(const Collective& call, const std::exception& error);
  // "rank R: <call> on <communicator> failed: <error>", then, on a process group's
  // communicator, what the other ranks are in and, when they differ, the likely cause.
  std::string failure_message(const Collective& call, const std::string& error) const;

  WorkerOptions options_;
  std::shared_ptr<CollectiveCheck> check_;  // the debug mode's, null without it
  int member_ = 0;                          // this worker's number in check_
  std::shared_ptr<Inquiry> inquiry_;
  int inquiry_member_ = 0;  // this worker's number in inquiry_
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<MpiTask>> queue_;  // submitted, not yet started; oldest first
  int64_t submitted_ = 0;                       // sequence number of the last collective submitted
  bool stopping_ = false;

  mutable std::mutex state_mutex_;
  WorkerState state_;

  std::unique_ptr<MpiWatchdog> watchdog_;  // started after the worker thread, stopped after it
  std::thread thread_;
};

// MPI and the ring read and write host memory: a tensor elsewhere (a GPU) goes through a host
// copy, made on the caller's thread (so it follows the caller's CUDA stream) and copied back by
// Work::wait() (MpiWorker::submit's `target` and `host`). Slow but correct; CUDA tensors belong
// on the NCCL backend.
torch::Tensor on_host(const torch::Tensor& tensor);

// The host backends' all_reduce_after_fill (communicator.h): for a tensor on the host, returns
// `fill`, for the worker to run first; for one elsewhere, runs it now (the host copy, made next,
// must hold what it writes) and returns an empty function. The worker's call runs it if any.
std::function<void()> fill_on_worker(const torch::Tensor& tensor, std::function<void()> fill);

}  // namespace detail
}  // namespace ddp

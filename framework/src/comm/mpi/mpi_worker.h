#pragma once
// The thread that runs a host communicator's collectives (MpiCommunicator's, the TCP ring's), as
// c10d's ProcessGroupMPI does: calls are queued and run one at a time in queue order, so
// all_reduce_async() returns at once and the order of collectives is the order of the calls, also
// for two communicators that share a worker (comm/compose/cpu_communicator.h).
//
// It owns a duplicate of the communicator it is given (MPI_ERRORS_RETURN), so its messages match
// no other traffic, and a watchdog (mpi_watchdog.h). Needs MPI_THREAD_MULTIPLE: the constructor
// throws std::runtime_error saying so when MPI provides less.
//
// Errors: what a queued call throws is rethrown by Work::wait() on the caller's thread; on a
// ProcessGroup's communicator (WorkerOptions::inquiry) with what the other ranks are in
// (inquiry.h), so a collective some ranks skipped is named on both sides: "rank 1: all_reduce #62
// float32[2570] (sum) on communicator 3 (...) failed: ...; rank 0 is in broadcast #62 ...". A wait
// unfinished after 5 s asks the other ranks, and fails with CollectivesDiffer when they are stuck
// in different collectives, long before the watchdog's timeout. A failure Open MPI reports to
// MPI_COMM_WORLD's handler instead (runtime.cpp) is named the same way (failing_call_message()).
//
// Before each collective runs, the ranks agree on it (collective_check.h): its kind, number, dtype,
// shape, reduce op or root; with the debug mode (WorkerOptions::check_collectives) also its
// communicator among a process group's. When any rank differs, every rank's Work::wait() throws
// the same error naming both sides, and no rank runs the collective.

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
  // How wait() waits: testing without pause for `spin`, then sleeping between tests (answering
  // the other ranks' inquiries), the sleeps doubling from 20 us up to `max_sleep`. `spin` 0:
  // sleep at once; `max_sleep` 0: never sleep, as a blocking MPI call.
  std::chrono::microseconds spin{1000};
  std::chrono::microseconds max_sleep{2000};
  // With check_collectives (WatchdogOptions'): the check shared by the communicators of one
  // ProcessGroup; unset: the worker makes one of its own (collective).
  std::shared_ptr<detail::CollectiveCheck> check;
  // Where a failed or hung collective asks what the other ranks are in (inquiry.h), shared
  // likewise; unset: the worker makes one of its own (collective).
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

  // Waits for `request` (WorkerOptions::spin). Worker thread only. `spin` false: sleeps from the
  // start, for a peer busy elsewhere (the hierarchical all-reduce's host phases), whose core
  // spinning would take. Throws CollectivesDiffer when the ranks are stuck in different
  // collectives.
  void wait(MPI_Request& request, bool spin = true) const;

  // For MPI_COMM_WORLD's error handler: on a worker thread running a collective, the message its
  // failure gets for `error` (MPI's text), as named_failure; "" on any other thread.
  static std::string failing_call_message(const std::string& error);

 private:
  void loop();
  WorkerState state() const;
  CallReport report() const;  // state() as the Inquiry reports it
  // Inside wait(), from 5 s on: throws CollectivesDiffer when the other ranks are stuck in other
  // collectives (the same answers twice, 1 s apart); true when `request` finished meanwhile.
  bool check_deadlock(MPI_Request& request) const;
  // The error of `call`'s failed run, with what the other ranks are in (failure_message).
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

// MPI and the ring use host memory: a tensor elsewhere (a GPU) goes through a host copy, made on
// the caller's thread (so it follows the caller's CUDA stream) and copied back by Work::wait().
// Slow but correct; CUDA tensors belong on the NCCL backend.
torch::Tensor on_host(const torch::Tensor& tensor);

// The host backends' all_reduce_after_fill (communicator.h): for a host tensor, returns `fill`
// for the worker's call to run first; for one elsewhere, runs it now, before the host copy, and
// returns an empty function.
std::function<void()> fill_on_worker(const torch::Tensor& tensor, std::function<void()> fill);

}  // namespace detail
}  // namespace ddp

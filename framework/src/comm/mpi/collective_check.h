#pragma once
// The debug mode's check (DDP_DEBUG=DETAIL; WorkerOptions::check_collectives): before each
// collective the ranks all-gather its fingerprint (comm/collective.h) and the number of the
// communicator it is called on. When any rank differs, every rank throws the same error naming
// both sides, and no rank runs the collective.
//
// One CollectiveCheck serves every communicator that joins it, as one sequence: ProcessGroup
// makes one for all the communicators it makes (cpu(), new_cpu_communicator(), for_device()'s
// CPU ones; so DistributedDataParallel's control and data communicators too). A rank that calls
// a collective on one of them while another rank calls one on a second is then named at the
// first such call ("rank 0 called all_reduce #4 ... on communicator 2 of the process group
// (DistributedDataParallel's control communicator) but rank 1 called barrier #3 on communicator
// 1 (ProcessGroup::cpu())"), where a check per communicator would leave both waiting, each in
// its own communicator, until the watchdog. A communicator made alone (an MpiCommunicator with
// check_collectives and no check given) has a check of its own: the same check, one member.
//
// Order: a call takes its place in the sequence (take_ticket) when it is queued, on the caller's
// thread under its worker's queue lock, so that within one worker the places follow the queue;
// the workers then take turns in place order (check). So the sequence is the order in which the
// process queued its calls, across communicators.
//
// Contract: that order must be the same on every rank, as the order of one communicator's calls
// must be anyway. A program that queues calls on two communicators of one group from two threads
// at once has no such order, and DETAIL may report it as a mismatch (it runs without DETAIL).
// ddp's own communicators are called from one thread at a time (the training thread, or
// autograd's while the training thread waits in backward()).
//
// Cost: only with check_collectives; per collective one all-gather of kRow int64 on the check's
// own MPI duplicate (as before, when it went over the worker's), and a hand-over between worker
// threads when consecutive calls are on different communicators.

#include "comm/collective.h"

#include <mpi.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace ddp::detail {

class CollectiveCheck {
 public:
  // Collective over `comm` (MPI_Comm_dup, MPI_ERRORS_RETURN): the check's all-gathers.
  explicit CollectiveCheck(MPI_Comm comm);
  // Frees the duplicate unless MPI is finalized. The workers that joined hold it (shared_ptr).
  ~CollectiveCheck();
  CollectiveCheck(const CollectiveCheck&) = delete;
  CollectiveCheck& operator=(const CollectiveCheck&) = delete;

  // A communicator joins: its number, 1 for the first. Communicators are made collectively, so
  // the numbers are the same on every rank. `name` says which it is in messages ("" : none).
  int join(const std::string& name);

  // The call's place in the sequence; when it is queued (see the header).
  int64_t take_ticket();

  // On the worker's thread: waits for the place `ticket`, all-gathers the fingerprint of `call`
  // on communicator `member`, and passes the turn on (also when it throws). `wait` waits for an
  // MPI request (MpiWorker::wait). Throws std::runtime_error naming both sides when the ranks
  // differ (the same message on every rank), or an MPI error.
  void check(int64_t ticket, int member, const Collective& call,
             const std::function<void(MPI_Request&)>& wait);

  // The all-gathered row: the fingerprint, then the communicator's number.
  static constexpr int kRow = Collective::kFingerprint + 1;
  using Row = std::array<int64_t, kRow>;
  // The message for rows that differ, "" when they agree; `names[m - 1]` names communicator m.
  static std::string mismatch(const std::vector<Row>& rows, const std::vector<std::string>& names);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 1;
  std::mutex mutex_;
  std::condition_variable turn_changed_;
  int64_t issued_ = 0;              // the last ticket taken
  int64_t turn_ = 1;                // the ticket whose check may run
  std::vector<std::string> names_;  // of the members, in the order they joined
};

}  // namespace ddp::detail

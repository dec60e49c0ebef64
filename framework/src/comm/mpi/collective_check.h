#pragma once
// The ranks' agreement on each collective before it runs, in two strengths:
//
// agree_on_call(), always (without the debug mode): the ranks all-reduce one 62-bit key of the
// call (Collective::agreement_key: kind, number, dtype, whole shape, reduce op or root) on the
// worker's own communicator before any byte of the tensor moves. Every rank learns whether all
// keys are equal; when they differ, the ranks all-gather what each called and every rank throws
// the same error naming both sides, and no rank runs the collective. So a call whose arguments
// differ across ranks never gives a silent wrong result (a float32 tensor summed as int32 bits),
// and no transfer sized by one rank lands in another rank's smaller buffer. The all-reduce also
// waits for every rank, so the large-message path needs no arrival barrier of its own.
// Cost: one MPI_Iallreduce of two int64 per collective (docs/records/performance.md).
//
// CollectiveCheck, the debug mode (WorkerOptions::check_collectives, DDP_DEBUG=DETAIL): before
// each collective the ranks all-gather its fingerprint (collective.h) and its communicator's
// number, across every communicator of a process group. When any rank differs, every rank
// throws the same error naming both sides, and no rank runs the collective. With it,
// agree_on_call() is not made: the debug mode's check covers it.
//
// One CollectiveCheck serves, as one sequence, every communicator a ProcessGroup makes, so a rank
// calling a collective on one while another rank calls one on a second is named at that call
// ("rank 0 called all_reduce #4 ... on communicator 2 of the process group (...) but rank 1 called
// barrier #3 on communicator 1 (...)"), not left waiting for the watchdog. A communicator made
// alone has a check of its own.
//
// Order: a call takes its place (take_ticket) when it is queued, under its worker's queue lock,
// and the workers take turns in place order (check). Contract: the process must queue its calls
// in the same order on every rank, across communicators; calls from two threads at once on two
// communicators of a group have no such order and may be reported as a mismatch.
//
// Cost: one all-gather of kRow int64 per collective, on the check's own MPI duplicate.

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

// On the worker's thread, before `call` runs: the agreement above over `comm` (the worker's
// duplicate). `wait` waits for an MPI request (MpiWorker::wait); `where` names the communicator
// ("communicator 1 (ProcessGroup::cpu())"). Throws std::runtime_error naming both sides, the
// same message on every rank, when the ranks' calls differ; or an MPI error.
void agree_on_call(MPI_Comm comm, const Collective& call, const std::string& where,
                   const std::function<void(MPI_Request&)>& wait);

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

  // The call's place in the sequence; taken when it is queued (see above).
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
  // This rank's row of `call` on communicator `member`.
  static Row row(const Collective& call, int member);

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

#pragma once
// What every rank's workers are in, asked when a collective fails or hangs, so that a collective
// called by some ranks only is named on both sides (always, without the debug mode).
//
// The host workers of one ProcessGroup (mpi_worker.h) join one Inquiry, in the order they are
// made, the same on every rank; a worker made alone has one of its own. A worker whose MPI call
// fails, or whose watchdog fires, asks every other rank over the Inquiry's own duplicate; each
// rank answers with its workers' calls, from whichever thread gets there first: a worker waiting
// in a collective (between its tests, after its spin) or a watchdog that fired. A rank whose
// workers are all idle does not answer, and the asker names it so.
//
// Why no polling thread of its own: one polling beside the workers' calls crashed Open MPI
// 4.1.4's shared-memory transport. Only a thread already inside MPI tests the question, one at a
// time (try_lock: a worker never waits for it).

#include "comm/collective.h"

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddp::detail {

// A worker's call as another rank reports it.
struct CallReport {
  int member = 0;   // the worker's number in the Inquiry (1 for the first joined)
  int64_t seq = 0;  // the last collective it entered (0: none yet)
  bool in_collective = false;
  Collective::Fingerprint fingerprint{};  // of `seq` (Collective::describe(fingerprint))
};

// One rank's answer: the calls of its workers; `answered` false when none came in time.
struct RankReport {
  bool answered = false;
  std::vector<CallReport> calls;

  // Whether the rank's worker `member` is in the collective of fingerprint `call`.
  bool in(int member, const Collective::Fingerprint& call) const {
    for (const CallReport& c : calls) {
      if (c.member == member && c.fingerprint == call) return true;
    }
    return false;
  }
};

class Inquiry {
 public:
  // Collective over `comm` (MPI_Comm_dup, MPI_ERRORS_RETURN); posts the receive for questions.
  explicit Inquiry(MPI_Comm comm);
  // Cancels the receive and frees the duplicate, unless MPI is finalized.
  ~Inquiry();
  Inquiry(const Inquiry&) = delete;
  Inquiry& operator=(const Inquiry&) = delete;

  int rank() const { return rank_; }

  // A worker joins: its number (1 for the first), the same on every rank when the workers are
  // made collectively. `name` says which communicator it serves in messages ("" : by number);
  // `state` reports what it is in: any thread, cheap. leave() before the worker goes.
  int join(const std::string& name, std::function<CallReport()> state);
  void leave(int member);
  // "communicator 3 (DistributedDataParallel's gradient communicator)", or "communicator 3".
  std::string name(int member) const;

  // Answers the questions that have come, when no other thread is answering. Cheap when none
  // came (one MPI_Test). Any thread.
  void answer();
  // Asks every other rank and waits up to `wait` for their answers, answering questions
  // meanwhile. Best effort: an MPI error only means no answer. Any thread; one ask at a time.
  // Answers carry their question's number, so a late answer to an earlier question is ignored.
  std::vector<RankReport> ask(std::chrono::milliseconds wait);
  // How long a failed or timed-out collective waits for the other ranks' answers before it names
  // the silent ones (a rank waiting in a collective answers within milliseconds).
  static constexpr std::chrono::milliseconds kAnswerWait{2000};

  // Calls a report's values travel in: a count, then per call its member, seq and
  // fingerprint, then the number of the question answered. Answers carry the first
  // kMaxCalls workers in a collective.
  static constexpr int kMaxCalls = 8;
  static constexpr int kCallValues = 2 + Collective::kFingerprint;
  static constexpr int kAnswerValues = 2 + kMaxCalls * kCallValues;

 private:
  std::vector<int64_t> encode_answer() const;
  void answer_locked();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;

  mutable std::mutex members_mutex_;
  struct Member {
    int number = 0;
    std::string name;
    std::function<CallReport()> state;  // empty once it left
  };
  std::vector<Member> members_;

  std::mutex ask_mutex_;   // one ask at a time: each takes the answers to its own question
  int64_t questions_ = 0;  // under ask_mutex_: the number of the latest question

  // Under answer_mutex_: the posted receive for questions and the answers being sent.
  std::mutex answer_mutex_;
  MPI_Request question_ = MPI_REQUEST_NULL;
  int64_t question_buffer_ = 0;
  struct Answer {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<int64_t> values;
  };
  std::deque<std::unique_ptr<Answer>> answers_;
};

// The calls a rank answered with: "all_reduce #4 float32[10] (sum) on communicator 3
// (DistributedDataParallel's gradient communicator)", joined by " and "; "" for none.
std::string describe_calls(const Inquiry& inquiry, const RankReport& report);

// What makes ranks call different collectives, for the end of a message that names them.
const char* mismatch_cause();

}  // namespace ddp::detail

#pragma once
// What every rank's workers are in, asked when a collective fails or hangs: the part that names
// both sides of a collective called by some ranks only, always (without DDP_DEBUG=DETAIL).
//
// The host workers of one ProcessGroup (comm/mpi/mpi_worker.h: ProcessGroup::cpu(),
// DistributedDataParallel's control and gradient communicators, new_cpu_communicator()) join one
// Inquiry, in the order they are made, which is the same on every rank. A worker made alone has
// one of its own. When a worker's MPI call fails (MPI_ERR_TRUNCATE: the ranks called different
// collectives) or its watchdog fires, it asks every other rank over the Inquiry's own duplicate
// communicator; each rank answers with the calls its joined workers are in, on whichever of its
// threads gets there first: a worker waiting in a collective answers between its tests (it tests
// the question's receive only after its spin, so a step whose collectives are on time never does
// it), a watchdog that fired answers while it asks. A rank whose workers are all idle (its
// program busy elsewhere, stopped or dead) does not answer; the asker names it so.
//
// Why the workers answer, not a polling thread: Open MPI 4.1.4's shared-memory transport crashed
// (SIGSEGV in mca_btl_vader_poll_handle_frag) when a thread of its own polled every 100 ms while
// the workers made their calls. Here only a thread already inside MPI (a waiting worker, a fired
// watchdog) tests the question, and one at a time (the Inquiry's lock, taken with try_lock: a
// worker never waits for it).

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
  // Each question has a number that its answer carries: a rank busy outside collectives answers
  // a question only when it next enters one, after the asker gave up, and that late answer must
  // not pass for the answer to a later question (it would report a call long finished).
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

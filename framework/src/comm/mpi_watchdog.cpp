#include "comm/mpi_watchdog.h"

#include "util/mpi_check.h"

#include <ddp/stop_signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ddp::detail {

namespace {

using Clock = std::chrono::steady_clock;

// The watchdogs' messages on their private communicator.
constexpr int kQuestionTag = 1;  // "what is your worker doing?" (the asker's sequence number)
constexpr int kAnswerTag = 2;    // {last sequence number entered, in it (0/1), its CollectiveKind}
constexpr auto kPoll = std::chrono::milliseconds(100);
// How long a timed-out rank waits for the others' answers before naming the silent ones.
constexpr auto kAnswerWait = std::chrono::seconds(2);

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  return text;
}

}  // namespace

MpiWatchdog::MpiWatchdog(MPI_Comm comm, WatchdogOptions options, std::function<WorkerState()> state)
    : options_(std::move(options)), state_(std::move(state)) {
  DDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // The receive for questions is posted before anyone can ask.
  DDP_MPI_CHECK(MPI_Irecv(&question_buffer_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQuestionTag, comm_,
                          &question_));
  thread_ = std::thread([this] { loop(); });
}

MpiWatchdog::~MpiWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (mpi_finalized()) return;
  if (question_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&question_);
    MPI_Wait(&question_, MPI_STATUS_IGNORE);
  }
  for (auto& answer : answers_) {
    // An answer to a rank that is gone may never be received: let MPI finish it alone (its
    // buffer must outlive it, so it is leaked; a few bytes, only after a watchdog question).
    if (answer->request != MPI_REQUEST_NULL) {
      MPI_Request_free(&answer->request);
      (void)answer.release();
    }
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiWatchdog::answer_questions() {
  if (mpi_finalized()) return;
  // Answers sent earlier: forget the finished ones.
  while (!answers_.empty()) {
    int done = 0;
    MPI_Test(&answers_.front()->request, &done, MPI_STATUS_IGNORE);
    if (!done) break;
    answers_.pop_front();
  }
  for (;;) {
    int asked = 0;
    MPI_Status status;
    if (question_ == MPI_REQUEST_NULL ||
        MPI_Test(&question_, &asked, &status) != MPI_SUCCESS || !asked) {
      return;
    }
    auto answer = std::make_unique<Answer>();
    const WorkerState state = state_();
    answer->values[0] = state.seq;
    answer->values[1] = state.in_collective ? 1 : 0;
    answer->values[2] = static_cast<int64_t>(state.kind);
    MPI_Isend(answer->values, 3, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag, comm_,
              &answer->request);
    answers_.push_back(std::move(answer));
    MPI_Irecv(&question_buffer_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQuestionTag, comm_, &question_);
  }
}

void MpiWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, kPoll, [this] { return stopping_; })) {
    lock.unlock();
    // No MPI call here in normal operation: Open MPI 4.1.4's shared-memory transport crashed
    // (SIGSEGV in mca_btl_vader_poll_handle_frag, ctest netns_two_hosts) when this thread
    // polled every 100 ms while the workers made their calls. Questions are answered only by
    // ranks whose own watchdog has fired (timed_out).
    const WorkerState state = state_();
    if (state.in_collective) {
      const auto now = Clock::now();
      if (now - state.entered > options_.timeout) timed_out(state, /*after_stop=*/false);
      // A stop signal that arrived while this collective was running (so less time ago than
      // the worker entered it), stop_grace ago or longer (see the header).
      const double since_stop = seconds_since_stop_signal();
      const double in_it = std::chrono::duration<double>(now - state.entered).count();
      const auto grace = static_cast<double>(options_.stop_grace.count());
      if (grace > 0 && since_stop > grace && since_stop < in_it) timed_out(state, /*after_stop=*/true);
    }
    lock.lock();
  }
}

void MpiWatchdog::timed_out(const WorkerState& state, bool after_stop) {
  // Ask every other rank what its worker is doing; the watchdogs of live ranks answer within
  // 100 ms, whatever their workers do. Best effort: MPI errors here only mean no answer.
  const int64_t question = state.seq;
  std::vector<int64_t> answers(static_cast<size_t>(3) * size_, -1);
  std::vector<MPI_Request> receives(size_, MPI_REQUEST_NULL), sends(size_, MPI_REQUEST_NULL);
  std::vector<bool> answered(size_, false);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Irecv(&answers[3 * r], 3, MPI_INT64_T, r, kAnswerTag, comm_, &receives[r]);
    MPI_Isend(&question, 1, MPI_INT64_T, r, kQuestionTag, comm_, &sends[r]);
  }
  const auto answer_wait = std::min<Clock::duration>(kAnswerWait, options_.timeout);
  const auto give_up = Clock::now() + answer_wait;
  int missing = size_ - 1;
  while (missing > 0 && Clock::now() < give_up) {
    answer_questions();  // another rank that timed out is asking this one
    for (int r = 0; r < size_; ++r) {
      if (receives[r] == MPI_REQUEST_NULL || answered[r]) continue;
      int done = 0;
      if (MPI_Test(&receives[r], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        answered[r] = true;
        --missing;
      }
    }
    if (missing > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  const std::string seconds =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(answer_wait).count());
  std::vector<std::string> never_arrived, waiting, elsewhere;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::string who = "rank " + std::to_string(r);
    if (!answered[r]) {
      never_arrived.push_back(who + " (no answer within " + seconds +
                              " s: stopped, dead, or its process hangs; or alive, waiting in a "
                              "collective of another communicator)");
      continue;
    }
    const int64_t seq = answers[3 * r], in_it = answers[3 * r + 1], kind = answers[3 * r + 2];
    const std::string its =
        std::string(kind_name(static_cast<CollectiveKind>(kind))) + " #" + std::to_string(seq);
    if (seq < state.seq) {
      never_arrived.push_back(who + (in_it ? " (still in " + its + ")"
                                           : seq == 0 ? " (has called no collective yet)"
                                                      : " (idle after " + its +
                                                            ": its program has not called #" +
                                                            std::to_string(state.seq) + " yet)"));
    } else if (seq == state.seq && kind == static_cast<int64_t>(state.kind)) {
      waiting.push_back(std::to_string(r));
    } else {
      elsewhere.push_back(who + " is in " + its +
                          " (the ranks call different collectives; DDP_DEBUG=DETAIL names them)");
    }
  }
  const std::string why =
      after_stop
          ? " unfinished " + std::to_string(options_.stop_grace.count()) + " s after " +
                stop_signal_name(stop_signal()) + " arrived while rank " + std::to_string(rank_) +
                " was in it, so no rank can reach the step boundary where it would stop "
                "(MpiOptions::stop_grace). Ranks that never arrived: "
          : " unfinished " + std::to_string(options_.timeout.count()) + " s after rank " +
                std::to_string(rank_) +
                " entered it (MpiOptions::timeout: --timeout, DDP_TIMEOUT_SECONDS). Ranks that "
                "never arrived: ";
  std::string message = "MPI watchdog on rank " + std::to_string(rank_) + ": " +
                        state.call->describe() + why +
                        (never_arrived.empty() ? std::string("none") : join(never_arrived));
  if (!elsewhere.empty()) message += "; " + join(elsewhere);
  if (!waiting.empty()) message += "; waiting in it too: rank(s) " + join(waiting);
  if (never_arrived.empty() && elsewhere.empty()) {
    message += " (every rank is in it: the transfer itself hangs, e.g. a rank stopped in the "
               "middle of it, or the network)";
  }
  if (!options_.check_collectives && !never_arrived.empty()) {
    // A live rank in another communicator's collective gives no answer here (its watchdog
    // watches that one): the debug mode names such a mismatch instead of waiting for it.
    message += ". If those ranks are alive, the ranks may call different collectives: run again "
               "with DDP_DEBUG=DETAIL, which names the first call that differs, on one "
               "communicator or across those of a process group (docs/reliability.md)";
  }
  message += ". Ending the job.";
  if (options_.on_fatal_error) options_.on_fatal_error(message);
  std::fprintf(stderr, "ddp: rank %d: %s\n", rank_, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ddp::detail

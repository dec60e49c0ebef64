#include "comm/mpi/inquiry.h"

#include "util/mpi_check.h"

#include <algorithm>
#include <thread>

namespace ddp::detail {

namespace {

using Clock = std::chrono::steady_clock;

// The messages on the Inquiry's duplicate.
constexpr int kQuestionTag = 1;  // "what are your workers in?": the question's number
constexpr int kAnswerTag = 2;    // Inquiry::kAnswerValues int64, the question's number last

}  // namespace

Inquiry::Inquiry(MPI_Comm comm) {
  DDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // Posted before anyone can ask.
  DDP_MPI_CHECK(MPI_Irecv(&question_buffer_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQuestionTag, comm_,
                          &question_));
}

Inquiry::~Inquiry() {
  if (mpi_finalized()) return;
  if (question_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&question_);
    MPI_Wait(&question_, MPI_STATUS_IGNORE);
  }
  for (auto& answer : answers_) {
    // An answer to a rank that is gone may never be received: MPI finishes it alone, and its
    // buffer must outlive it, so it is leaked (a few hundred bytes, only after a question).
    if (answer->request != MPI_REQUEST_NULL) {
      MPI_Request_free(&answer->request);
      (void)answer.release();
    }
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

int Inquiry::join(const std::string& name, std::function<CallReport()> state) {
  std::lock_guard<std::mutex> lock(members_mutex_);
  const int number = static_cast<int>(members_.size()) + 1;
  members_.push_back({number, name, std::move(state)});
  return number;
}

void Inquiry::leave(int member) {
  std::lock_guard<std::mutex> lock(members_mutex_);
  if (member >= 1 && member <= static_cast<int>(members_.size())) members_[member - 1].state = {};
}

std::string Inquiry::name(int member) const {
  std::lock_guard<std::mutex> lock(members_mutex_);
  std::string text = "communicator " + std::to_string(member);
  if (member >= 1 && member <= static_cast<int>(members_.size()) &&
      !members_[member - 1].name.empty()) {
    text += " (" + members_[member - 1].name + ")";
  }
  return text;
}

std::vector<int64_t> Inquiry::encode_answer() const {
  std::vector<int64_t> values(kAnswerValues, 0);
  std::lock_guard<std::mutex> lock(members_mutex_);
  int64_t count = 0;
  for (const Member& member : members_) {
    if (!member.state || count == kMaxCalls) continue;
    const CallReport call = member.state();
    if (!call.in_collective) continue;
    int64_t* at = &values[1 + count * kCallValues];
    at[0] = member.number;
    at[1] = call.seq;
    std::copy(call.fingerprint.begin(), call.fingerprint.end(), at + 2);
    ++count;
  }
  values[0] = count;
  return values;
}

void Inquiry::answer_locked() {
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
    if (question_ == MPI_REQUEST_NULL || MPI_Test(&question_, &asked, &status) != MPI_SUCCESS ||
        !asked) {
      return;
    }
    auto answer = std::make_unique<Answer>();
    answer->values = encode_answer();
    answer->values.back() = question_buffer_;
    MPI_Isend(answer->values.data(), kAnswerValues, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag,
              comm_, &answer->request);
    answers_.push_back(std::move(answer));
    MPI_Irecv(&question_buffer_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQuestionTag, comm_, &question_);
  }
}

void Inquiry::answer() {
  std::unique_lock<std::mutex> lock(answer_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || mpi_finalized()) return;
  answer_locked();
}

std::vector<RankReport> Inquiry::ask(std::chrono::milliseconds wait) {
  std::vector<RankReport> reports(size_);
  if (mpi_finalized()) return reports;
  std::lock_guard<std::mutex> one_ask(ask_mutex_);
  // The question's number outlives a send MPI finishes alone: asks are rare (a failed or stuck
  // collective), so their numbers are kept for the life of the process.
  static std::mutex numbers_mutex;
  static std::deque<int64_t> numbers;
  const int64_t* question = nullptr;
  {
    std::lock_guard<std::mutex> lock(numbers_mutex);
    numbers.push_back(++questions_);
    question = &numbers.back();
  }
  std::vector<int64_t> answers(static_cast<size_t>(kAnswerValues) * size_, 0);
  std::vector<MPI_Request> receives(size_, MPI_REQUEST_NULL), sends(size_, MPI_REQUEST_NULL);
  auto receive = [&](int r) {
    MPI_Irecv(&answers[static_cast<size_t>(kAnswerValues) * r], kAnswerValues, MPI_INT64_T, r,
              kAnswerTag, comm_, &receives[r]);
  };
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    receive(r);
    MPI_Isend(question, 1, MPI_INT64_T, r, kQuestionTag, comm_, &sends[r]);
  }
  int missing = size_ - 1;
  const auto give_up = Clock::now() + wait;
  while (missing > 0 && Clock::now() < give_up) {
    answer();  // another rank may be asking this one
    for (int r = 0; r < size_; ++r) {
      if (receives[r] == MPI_REQUEST_NULL || reports[r].answered) continue;
      int done = 0;
      if (MPI_Test(&receives[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) continue;
      if (answers[static_cast<size_t>(kAnswerValues) * (r + 1) - 1] != *question) {
        receive(r);  // a late answer to an earlier question: wait for this one's
        continue;
      }
      reports[r].answered = true;
      --missing;
    }
    if (missing > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < size_; ++r) {
    if (!reports[r].answered) continue;
    const int64_t* values = &answers[static_cast<size_t>(kAnswerValues) * r];
    const int64_t count = std::clamp<int64_t>(values[0], 0, kMaxCalls);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t* at = values + 1 + i * kCallValues;
      CallReport call;
      call.member = static_cast<int>(at[0]);
      call.seq = at[1];
      call.in_collective = true;  // only calls in a collective are sent
      std::copy(at + 2, at + kCallValues, call.fingerprint.begin());
      reports[r].calls.push_back(call);
    }
  }
  // A receive still pending is cancelled (a cancelled receive completes at once), so none
  // writes into `answers` later; a send still pending is left to MPI (its buffer is static).
  for (int r = 0; r < size_; ++r) {
    if (receives[r] != MPI_REQUEST_NULL && !reports[r].answered) {
      MPI_Cancel(&receives[r]);
      MPI_Wait(&receives[r], MPI_STATUS_IGNORE);
    }
    if (sends[r] != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&sends[r], &done, MPI_STATUS_IGNORE);
      if (!done) MPI_Request_free(&sends[r]);
    }
  }
  return reports;
}

std::string describe_calls(const Inquiry& inquiry, const RankReport& report) {
  std::string text;
  for (size_t i = 0; i < report.calls.size(); ++i) {
    const CallReport& call = report.calls[i];
    text += (i ? " and " : "") + Collective::describe(call.fingerprint) + " on " +
            inquiry.name(call.member);
  }
  return text;
}

const char* mismatch_cause() {
  return "A collective called by some ranks only, or by the ranks in another order, does this: "
         "e.g. a forward through DistributedDataParallel in training mode on some ranks only "
         "(before each such forward it broadcasts rank 0's buffers: call the module itself "
         "there, model.module(), or run it under torch::NoGradGuard), an evaluation or a save "
         "that makes collectives on rank 0 alone, or per-rank data of different lengths (a rank "
         "that runs out leaves the others in the step's all-reduce: loop between model.join() and "
         "join.finish())";
}

}  // namespace ddp::detail

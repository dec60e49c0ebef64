#include "comm/mpi/collective_check.h"

#include "comm/mpi/inquiry.h"
#include "util/mpi_check.h"

#include <algorithm>
#include <stdexcept>

namespace ddp::detail {

namespace {

// "communicator 2 (DistributedDataParallel's control communicator)".
std::string communicator(int64_t member, const std::vector<std::string>& names) {
  const bool named = member >= 1 && member <= static_cast<int64_t>(names.size()) &&
                     !names[static_cast<size_t>(member - 1)].empty();
  return "communicator " + std::to_string(member) +
         (named ? " (" + names[static_cast<size_t>(member - 1)] + ")" : std::string());
}

Collective::Fingerprint fingerprint_of(const CollectiveCheck::Row& row) {
  Collective::Fingerprint f{};
  std::copy(row.begin(), row.begin() + Collective::kFingerprint, f.begin());
  return f;
}

}  // namespace

CollectiveCheck::CollectiveCheck(MPI_Comm comm) {
  DDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

CollectiveCheck::~CollectiveCheck() {
  if (!detail::mpi_finalized() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

int CollectiveCheck::join(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  names_.push_back(name);
  return static_cast<int>(names_.size());
}

int64_t CollectiveCheck::take_ticket() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ++issued_;
}

void CollectiveCheck::check(int64_t ticket, int member, const Collective& call,
                            const std::function<void(MPI_Request&)>& wait) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    turn_changed_.wait(lock, [&] { return turn_ == ticket; });
  }
  // The next place's check may run once this one is over, however it ends.
  struct PassTurn {
    CollectiveCheck& check;
    ~PassTurn() {
      {
        std::lock_guard<std::mutex> lock(check.mutex_);
        ++check.turn_;
      }
      check.turn_changed_.notify_all();
    }
  } pass{*this};
  const Row mine = row(call, member);
  std::vector<Row> all(static_cast<size_t>(size_));
  MPI_Request request;
  DDP_MPI_CHECK(MPI_Iallgather(mine.data(), kRow, MPI_INT64_T, all.data(), kRow, MPI_INT64_T, comm_,
                               &request));
  wait(request);
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    message = mismatch(all, names_);
  }
  // Every rank gathered the same rows, so every rank throws this same message and none runs
  // the collective: the communicators stay usable, and the job ends from the caller's error.
  if (!message.empty()) throw std::runtime_error(message);
}

namespace {

// "rank 0 called <call> but rank 1 called <other>, rank 3 called <other>" for the ranks whose row
// differs from rank 0's, "" when none does; each call "on <communicator>" unless all rows name
// one communicator (`one_communicator`, set).
std::string differing_calls(const std::vector<CollectiveCheck::Row>& rows,
                            const std::vector<std::string>& names, bool& one_communicator) {
  constexpr int member = CollectiveCheck::kRow - 1;
  one_communicator = true;
  for (size_t r = 1; r < rows.size(); ++r) {
    if (rows[r] != rows[0])
      one_communicator = one_communicator && rows[r][member] == rows[0][member];
  }
  auto call = [&](size_t r) {
    return "rank " + std::to_string(r) + " called " +
           Collective::describe(fingerprint_of(rows[r])) +
           (one_communicator ? "" : " on " + communicator(rows[r][member], names));
  };
  std::string others;
  for (size_t r = 1; r < rows.size(); ++r) {
    if (rows[r] != rows[0]) others += (others.empty() ? "" : ", ") + call(r);
  }
  return others.empty() ? "" : call(0) + " but " + others;
}

}  // namespace

CollectiveCheck::Row CollectiveCheck::row(const Collective& call, int member) {
  const Collective::Fingerprint f = call.fingerprint();
  Row row{};
  std::copy(f.begin(), f.end(), row.begin());
  row[kRow - 1] = member;
  return row;
}

std::string CollectiveCheck::mismatch(const std::vector<Row>& rows,
                                      const std::vector<std::string>& names) {
  bool one_communicator = true;
  const std::string calls = differing_calls(rows, names, one_communicator);
  if (calls.empty()) return "";
  if (one_communicator) {
    const int64_t member = rows[0][kRow - 1];
    const bool shared = names.size() > 1 || (!names.empty() && !names[0].empty());
    return "DDP_DEBUG=DETAIL: the ranks call different collectives on one communicator: " + calls +
           (shared ? " (" + communicator(member, names) + " of the process group)" : "");
  }
  return "DDP_DEBUG=DETAIL: the ranks call collectives on different communicators of one process "
         "group (in another order, or one rank on one communicator while another waits on a "
         "second): " +
         calls;
}

void agree_on_call(MPI_Comm comm, const Collective& call, const std::string& where,
                   const std::function<void(MPI_Request&)>& wait) {
  // The minimum of every key and of every key's negation: equal and opposite exactly when all
  // keys are equal, and the same two numbers on every rank, so all ranks decide alike.
  const int64_t key = call.agreement_key();
  std::array<int64_t, 2> extremes{key, -key};
  MPI_Request request;
  DDP_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, extremes.data(), 2, MPI_INT64_T, MPI_MIN, comm, &request));
  wait(request);
  if (extremes[0] == -extremes[1]) return;
  // Some call differs: rare, so only now the ranks say what each called.
  int size = 1;
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  const CollectiveCheck::Row mine = CollectiveCheck::row(call, 1);
  std::vector<CollectiveCheck::Row> rows(static_cast<size_t>(size));
  DDP_MPI_CHECK(MPI_Iallgather(mine.data(), CollectiveCheck::kRow, MPI_INT64_T, rows.data(),
                               CollectiveCheck::kRow, MPI_INT64_T, comm, &request));
  wait(request);
  bool one_communicator = true;
  std::string calls = differing_calls(rows, {}, one_communicator);
  if (calls.empty()) {  // the descriptions show the first dimensions only
    calls = "rank 0 called " + Collective::describe(fingerprint_of(rows[0])) +
            ", and another rank the same call on a tensor whose shape differs past the dimensions "
            "shown";
  }
  // Another kind or number: a call some ranks skipped or made alone. Else the same call with
  // other arguments.
  bool other_call = false;
  for (const CollectiveCheck::Row& row : rows) other_call = other_call || row[0] != rows[0][0];
  for (const CollectiveCheck::Row& row : rows) other_call = other_call || row[1] != rows[0][1];
  throw std::runtime_error("the ranks call different collectives on " + where + ": " + calls +
                           ". " +
                           (other_call ? mismatch_cause()
                                       : "Every rank must pass the same dtype, shape, reduce op "
                                         "and root"));
}

}  // namespace ddp::detail

#include "comm/mpi/collective_check.h"

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
  const Collective::Fingerprint f = call.fingerprint();
  Row mine{};
  std::copy(f.begin(), f.end(), mine.begin());
  mine[kRow - 1] = member;
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

std::string CollectiveCheck::mismatch(const std::vector<Row>& rows,
                                      const std::vector<std::string>& names) {
  bool one_communicator = true;
  std::string others;
  for (size_t r = 1; r < rows.size(); ++r) {
    if (rows[r] == rows[0]) continue;
    one_communicator = one_communicator && rows[r][kRow - 1] == rows[0][kRow - 1];
  }
  auto call = [&](size_t r) {
    return "rank " + std::to_string(r) + " called " +
           Collective::describe(fingerprint_of(rows[r])) +
           (one_communicator ? "" : " on " + communicator(rows[r][kRow - 1], names));
  };
  for (size_t r = 1; r < rows.size(); ++r) {
    if (rows[r] != rows[0]) others += (others.empty() ? "" : ", ") + call(r);
  }
  if (others.empty()) return "";
  if (one_communicator) {
    const int64_t member = rows[0][kRow - 1];
    const bool shared = names.size() > 1 || (!names.empty() && !names[0].empty());
    return "DDP_DEBUG=DETAIL: the ranks call different collectives on one communicator: " +
           call(0) + " but " + others +
           (shared ? " (" + communicator(member, names) + " of the process group)" : "");
  }
  return "DDP_DEBUG=DETAIL: the ranks call collectives on different communicators of one process "
         "group (in another order, or one rank on one communicator while another waits on a "
         "second): " +
         call(0) + " but " + others;
}

}  // namespace ddp::detail

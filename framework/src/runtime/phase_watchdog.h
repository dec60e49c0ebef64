#pragma once
// The phase watchdog behind ddp::WatchedPhase (<ddp/runtime.h>, whose comment is the contract):
// what the Runtime tells it, and the phases of MPI start-up, which have their own limit.

#include <chrono>
#include <cstdint>
#include <string>

namespace ddp::detail {

// Who this process is, for the message: the launcher's rank before MPI_Init (-1: unknown), then
// MPI's rank and processor name (an empty host keeps the one known: gethostname's at first).
void set_phase_identity(int rank, const std::string& host);

// Whether the watchdog may end the job with MPI_Abort (from MPI_Init's return to just before
// MPI_Finalize); otherwise it ends this process alone and leaves the others to the launcher.
void set_phase_mpi_ready(bool ready);

// Enters a phase of the calling thread: `limit` says where `timeout` comes from and `why` what
// it waits for (may be empty), in the message; `slack` is added before it fires (WatchedPhase:
// 5 s, see its comment). Returns its id.
uint64_t enter_phase(const std::string& what, const std::string& why, std::chrono::seconds timeout,
                     const std::string& limit, std::chrono::seconds slack);
void leave_phase(uint64_t id);

// A phase while it lives (enter_phase, leave_phase).
class ScopedPhase {
 public:
  ScopedPhase(const std::string& what, const std::string& why, std::chrono::seconds timeout,
              const std::string& limit, std::chrono::seconds slack)
      : id_(enter_phase(what, why, timeout, limit, slack)) {}
  ~ScopedPhase() { leave_phase(id_); }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  uint64_t id_;
};

// A phase of MPI start-up, no slack (no other watchdog runs yet). Its limit: `timeout` when > 0
// (RuntimeOptions::startup_timeout: --timeout), else DDP_STARTUP_TIMEOUT_SECONDS, else 600 s.
// `why` is the likely cause, said in the message.
ScopedPhase startup_phase(const std::string& what, const std::string& why,
                          std::chrono::seconds timeout);

// A phase that waits for every rank with no collective watchdog inside (MPI_Comm_dup,
// ncclCommInitRank, MPI_Finalize): the phase timeout, no slack.
ScopedPhase setup_phase(const std::string& what, const std::string& why);

}  // namespace ddp::detail

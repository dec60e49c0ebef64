#pragma once
// The one check for MPI calls: on failure, throws std::runtime_error with the world rank,
// file:line, the call, and MPI's own error string. An error of the classes that ranks calling
// different collectives (or the same one with other sizes, types or roots) cause adds where to
// look: DDP_DEBUG=DETAIL, which names the first call that differs (comm/mpi/collective_check.h).

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace ddp::detail {

// MPI's error string for `code`, with where to look when its class is one of a mismatch's.
inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  int error_class = MPI_ERR_OTHER;
  MPI_Error_class(code, &error_class);
  const bool mismatch = error_class == MPI_ERR_TRUNCATE || error_class == MPI_ERR_COUNT ||
                        error_class == MPI_ERR_TYPE || error_class == MPI_ERR_OP ||
                        error_class == MPI_ERR_ROOT;
  return std::string(text, length) +
         (mismatch ? " (ranks that call different collectives, or the same with other sizes, "
                     "cause this: DDP_DEBUG=DETAIL names the first call that differs)"
                   : "");
}

// Whether MPI_Finalize has run: MPI handles are not freed after it (no MPI call is allowed).
inline bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

inline void mpi_check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  int rank = -1, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw std::runtime_error("rank " + std::to_string(rank) + ": " + file + ":" +
                           std::to_string(line) + ": " + call + " failed: " + mpi_error_text(code));
}

}  // namespace ddp::detail

#define DDP_MPI_CHECK(call) ::ddp::detail::mpi_check((call), #call, __FILE__, __LINE__)

#pragma once
// The one check for MPI calls: on failure, throws std::runtime_error with the world rank,
// file:line, the call, and MPI's own error string.

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace ddp::detail {

inline void mpi_check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  int rank = -1, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw std::runtime_error("rank " + std::to_string(rank) + ": " + file + ":" +
                           std::to_string(line) + ": " + call + " failed: " +
                           std::string(text, length));
}

}  // namespace ddp::detail

#define DDP_MPI_CHECK(call) ::ddp::detail::mpi_check((call), #call, __FILE__, __LINE__)

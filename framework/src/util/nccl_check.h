#pragma once
// The one check for NCCL calls: on failure, throws std::runtime_error with the world rank, the
// host, file:line, the call, NCCL's error string and its last detailed message.

#include "util/host_name.h"

#include <nccl.h>

#include <stdexcept>
#include <string>

namespace ddp::detail {

inline void nccl_check(ncclResult_t code, const char* call, const char* file, int line, int rank) {
  if (code == ncclSuccess) return;
  std::string message = rank_and_host(rank) + ": " + file + ":" + std::to_string(line) + ": " +
                        call + " failed: " + ncclGetErrorString(code);
  if (const char* last = ncclGetLastError(nullptr); last && *last) {
    message += " (" + std::string(last) + ")";
  }
  throw std::runtime_error(message);
}

}  // namespace ddp::detail

#define DDP_NCCL_CHECK(call, rank) \
  ::ddp::detail::nccl_check((call), #call, __FILE__, __LINE__, (rank))

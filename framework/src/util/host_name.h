#pragma once
// This machine's name (gethostname), for lock files, checkpoints' temporary names and event files;
// "localhost" when it has none.

#include <unistd.h>

#include <string>

namespace ddp::detail {

inline std::string host_name(const char* none = "localhost") {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return none;
  return name;
}

// Where a failed check happened, for the CUDA and NCCL check macros: "rank 1 (host n1)".
inline std::string rank_and_host(int rank) {
  return "rank " + std::to_string(rank) + " (host " + host_name("?") + ")";
}

}  // namespace ddp::detail

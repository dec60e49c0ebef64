#pragma once
// Where a failed check happened, for the CUDA and NCCL check macros: "rank 1 (host n1)".

#include <unistd.h>

#include <string>

namespace ddp::detail {

inline std::string rank_and_host(int rank) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  return "rank " + std::to_string(rank) + " (host " + host + ")";
}

}  // namespace ddp::detail

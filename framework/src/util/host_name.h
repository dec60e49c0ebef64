#pragma once
// This machine's name (gethostname), for lock files, checkpoints' temporary names and event files;
// "localhost" when it has none.

#include <unistd.h>

#include <string>

namespace ddp::detail {

inline std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace ddp::detail

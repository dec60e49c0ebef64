#pragma once
// The one form of a file's error: "<path>: <what>", and ": <strerror(error)>" after a failed
// system call (`error` captured by the caller before any clean-up can overwrite errno).

#include <cstring>
#include <stdexcept>
#include <string>

#include <sys/stat.h>

namespace ddp::detail {

[[noreturn]] inline void throw_file_error(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

[[noreturn]] inline void throw_file_error(const std::string& path, const std::string& what,
                                          int error) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(error));
}

// Why a file of stat's `mode` is no data file ("not a regular file: it is a directory", "not a
// regular file"), or null for a regular file.
inline const char* not_regular(mode_t mode) {
  if (S_ISREG(mode)) return nullptr;
  return S_ISDIR(mode) ? "not a regular file: it is a directory" : "not a regular file";
}

}  // namespace ddp::detail

#pragma once
// The one form of a file's error: "<path>: <what>", and ": <strerror(error)>" after a failed
// system call (`error` captured by the caller before any clean-up can overwrite errno).

#include <cstring>
#include <stdexcept>
#include <string>

namespace ddp::detail {

[[noreturn]] inline void throw_file_error(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

[[noreturn]] inline void throw_file_error(const std::string& path, const std::string& what,
                                          int error) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(error));
}

}  // namespace ddp::detail

#pragma once
// Timing: the library's one clock (monotonic) and "how long since".

#include <chrono>

namespace ddp {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace ddp

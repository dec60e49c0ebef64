#pragma once
/// \file
/// A per-rank record of what happened when during training, written as one Chrome-trace /
/// Perfetto JSON for all ranks (open it in ui.perfetto.dev or chrome://tracing; render a PNG with
/// scripts/timeline_png.py). Thread-safe: any thread may record into it.
///
/// Times are microseconds since the construction of the Timeline, which is collective and ends
/// with a barrier, so ranks on one host share an origin.

#include <ddp/communicator.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace ddp {

/// What happened when on each rank (this file's comment says how it is written).
class Timeline {
 public:
  using Clock = std::chrono::steady_clock;  ///< the clock of the time points recorded
  /// The row an event is drawn in.
  enum Lane {
    kMainThread = 0,  ///< the training thread's work
    kCommThread = 1,  ///< the communicators' work
  };

  /// Collective over `comm` (ends with a barrier: the origin of every rank's times).
  explicit Timeline(Communicator& comm);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  /// Records something that lasted from `start` to `end`; any thread may call it.
  void span(const std::string& name, const char* category, Clock::time_point start,
            Clock::time_point end, Lane lane = kMainThread);
  /// Records a moment; any thread may call it.
  void instant(const std::string& name, const char* category, Clock::time_point at,
               Lane lane = kMainThread);

  /// Gathers every rank's events and has rank 0 write them to `path` (collective).
  void write(const std::string& path);

  /// The events recorded on this rank so far.
  size_t size() const;

 private:
  struct Impl;  ///< the communicator, the origin and the events under a mutex
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#pragma once
/// \file
/// Stopping every rank before the same step when a scheduler asks one of them to stop (SIGTERM,
/// SIGUSR1, SIGUSR2: <ddp/stop_signal.h>). A loop gets it through StepBoundary (step_boundary.h).
///
/// Why an agreement: a signal reaches one rank (SIGTERM to one task) or all of them at slightly
/// different moments (mpirun and srun forward it); a rank that stopped on its own would leave the
/// others waiting in the next gradient all-reduce. So every `every` steps the ranks all-reduce
/// (Max) three doubles on the group's CPU communicator: the signal each got (0: none), its rank and
/// the seconds since it arrived. Every rank gets the same answer, so all stop before the same step.
/// A part that agrees on more at the same boundary sends it in the same all-reduce: values(), then
/// decide() on the maximum (StepBoundary does).
///
/// The handlers are installed for the object's lifetime unless `every` is 0 (nesting is counted).
/// Invariants: every rank calls should_stop() with the same step sequence; once it has returned
/// true it keeps returning true without communicating.

#include <ddp/process_group.h>
#include <ddp/stop_signal.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ddp {

/// The agreement of the file's text.
class StopAgreement {
 public:
  /// `every`: steps between the checks (the check runs when step % every == 0). 0: no checks,
  /// and no handlers: the signals keep their default action (the process dies). Throws
  /// std::invalid_argument naming StopAgreement's `every` when it is negative.
  explicit StopAgreement(ProcessGroup& group, int64_t every = 1);

  /// Collective at a step boundary, before optimizer step `step` + 1: whether the ranks stop
  /// here. Communicates only when step % every == 0 (and not yet stopping).
  bool should_stop(int64_t step);
  ///@{
  /// should_stop()'s two halves: this rank's values (the signal, the rank, the seconds since),
  /// and the decision from their maximum over the ranks (`agreed`, kValues doubles; what
  /// should_stop returns). Local.
  static constexpr int kValues = 3;
  std::array<double, kValues> values() const;
  bool decide(const double* agreed);
  ///@}
  /// Whether should_stop() has returned true (the ranks agreed to stop). Local.
  bool stopping() const { return signal_ != 0; }
  ///@{
  /// After should_stop() returned true: the highest signal number any rank got (SIGTERM,
  /// SIGUSR1, SIGUSR2), the highest rank that got one, and the seconds from that signal to now
  /// on the rank that waited longest. 0, -1 and 0 before.
  int signal() const { return signal_; }
  int rank() const { return rank_; }
  double seconds_since_signal() const;
  ///@}
  /// "SIGTERM (rank 1)".
  std::string describe() const;

  int64_t every() const { return every_; }  ///< steps between the checks, as constructed

 private:
  ProcessGroup& group_;
  int64_t every_;
  std::optional<StopSignalHandlers> handlers_;
  int signal_ = 0;
  int rank_ = -1;
  double waited_ = 0;  ///< at the check, on the rank that waited longest
  std::chrono::steady_clock::time_point decided_at_{};
};

}  // namespace ddp

#pragma once
/// \file
/// The stop request a scheduler sends ahead of killing a job: a signal handler that only records
/// which signal came and when, so a training loop can stop at its next step boundary, save where
/// it stands and exit (docs/reliability.md). The handler does nothing else: whatever a signal
/// interrupts (an MPI call, an allocation, a write) goes on, and the loop acts on the flag.
///
/// The signals are the ones that reach a rank ahead of a kill:
///   SIGTERM  Slurm at the time limit and on preemption (SIGKILL follows after KillWait or
///            GraceTime); Open MPI's mpirun to its ranks when it gets SIGTERM or SIGINT itself
///            (SIGKILL follows after odls_base_sigkill_timeout, 1 s by default);
///   SIGUSR1, SIGUSR2  `sbatch --signal=USR1@SECONDS` and `scancel --signal=USR1`; forwarded to
///            the ranks by mpirun and srun.
/// SIGINT (Ctrl-C) keeps its default: someone at a terminal wants the job gone now.

#include <csignal>

namespace ddp {

/// The exit status of a program that stopped on one of these signals after saving its state:
/// EX_TEMPFAIL from <sysexits.h>, "temporary failure, retry later". Not 0: the training is not
/// finished, and whatever runs after a successful job must not start. Not 1: nothing went wrong.
/// Not 128 + the signal: mpirun and srun report that as a death by signal, and a job script
/// could not tell a saved stop from a kill. The slurm/ scripts requeue the job on it.
constexpr int kStoppedExitCode = 75;

/// Installs the stop handlers for SIGTERM, SIGUSR1 and SIGUSR2 while it lives, and puts the
/// previous handlers back when the last one is destroyed (nesting is counted, under a lock: the
/// Trainers of a process's replica threads each install them).
class StopSignalHandlers {
 public:
  StopSignalHandlers();
  ~StopSignalHandlers();
  StopSignalHandlers(const StopSignalHandlers&) = delete;
  StopSignalHandlers& operator=(const StopSignalHandlers&) = delete;
};

/// The first stop signal received while handlers were installed, or 0. Not cleared by removing
/// the handlers.
int stop_signal();

/// Seconds since the first stop signal arrived (CLOCK_MONOTONIC), or -1 when none did.
double seconds_since_stop_signal();

/// Forgets a received signal (for a program that handled it and goes on, and for tests).
void clear_stop_signal();

/// "SIGTERM", "SIGUSR1", "SIGUSR2", else "signal N".
const char* stop_signal_name(int signal);

}  // namespace ddp

#pragma once
/// \file
/// The stop request a scheduler sends ahead of killing a job: a signal handler that only records
/// which signal came and when, so a training loop can stop at its next step boundary, save where
/// it stands and exit (docs/reliability.md). The handler does nothing else: whatever a signal
/// interrupts (an MPI call, an allocation, a write) goes on, and the loop acts on the flag.
///
/// The signals are those that reach a rank ahead of a kill: SIGTERM (Slurm at the time limit and
/// on preemption; mpirun to its ranks when it gets SIGTERM or SIGINT), SIGUSR1 and SIGUSR2
/// (`sbatch --signal=USR1@SECONDS`, `scancel --signal=USR1`; forwarded by mpirun and srun).
/// SIGINT (Ctrl-C) keeps its default: someone at a terminal wants the job gone now.
///
/// One exception: in a rank that Open MPI's mpirun started (ORTE), a SIGTERM from its parent while
/// no stop is under way kills as by default: it is mpirun ending the job, SIGKILL follows within a
/// second, and nothing saved then would be used. Slurm's SIGTERM stays a stop request.
///
/// Cover the program's whole life: handlers installed only around the training loop let a signal
/// during start-up, or while finishing after a stop, kill the rank, and a requeue sees a kill.
/// ddp::cli::run holds them throughout; a program with its own main makes a StopSignalHandlers
/// main's first local, before ddp::Runtime, and stops through a ddp::StopAgreement (or the
/// Trainer). DDP_STOP_HANDLERS_BEFORE_MAIN() covers LibTorch's static initialisers too.

#include <csignal>

namespace ddp {

/// The exit status of a program that stopped on one of these signals after saving its state:
/// EX_TEMPFAIL from <sysexits.h>, "temporary failure, retry later". Not 0: the training is not
/// finished, and whatever runs after a successful job must not start. Not 1: nothing went wrong.
/// Not 128 + the signal: mpirun and srun report that as a death by signal, and a job script
/// could not tell a saved stop from a kill. The slurm/ scripts requeue the job on it.
constexpr int kStoppedExitCode = 75;

/// Installs the stop handlers for SIGTERM, SIGUSR1 and SIGUSR2 while it lives, and puts the
/// previous handlers back when the last one is destroyed (nesting is counted, under a lock, so
/// any thread may install them).
class StopSignalHandlers {
 public:
  StopSignalHandlers();
  ~StopSignalHandlers();
  StopSignalHandlers(const StopSignalHandlers&) = delete;
  StopSignalHandlers& operator=(const StopSignalHandlers&) = delete;
};

/// Installs the stop handlers for the rest of the process's life (never removed). What
/// DDP_STOP_HANDLERS_BEFORE_MAIN() calls.
void install_stop_handlers_for_life();

/// Put once at namespace scope in a source file of the executable: installs the stop handlers
/// before any library's static initialiser runs (an ELF .preinit_array entry), so a stop signal
/// during LibTorch's and MPI's start-up is recorded instead of killing. Executables only: a shared
/// library's .preinit_array is ignored.
#define DDP_STOP_HANDLERS_BEFORE_MAIN()                                                       \
  __attribute__((section(".preinit_array"), used)) static void (*ddp_stop_handlers_preinit_)( \
      int, char**, char**) = [](int, char**, char**) { ::ddp::install_stop_handlers_for_life(); }

/// The first stop signal received while handlers were installed, or 0. Not cleared by removing
/// the handlers.
int stop_signal();

/// Seconds since the first stop signal arrived (CLOCK_MONOTONIC), or -1 when none did.
double seconds_since_stop_signal();

/// Forgets a received signal (for a program that handled it and goes on, and for tests).
void clear_stop_signal();

/// Tells the handlers that this process is stopping on a signal another rank received
/// (StopAgreement calls it when the ranks agree to stop): from then on a SIGTERM from Open MPI's
/// mpirun is caught like any stop signal (see above), so a rank still saving is not killed at once
/// when a faster one has exited 75. clear_stop_signal() forgets it too.
void mark_stopping();

/// "SIGTERM", "SIGUSR1", "SIGUSR2", else "signal N".
const char* stop_signal_name(int signal);

}  // namespace ddp

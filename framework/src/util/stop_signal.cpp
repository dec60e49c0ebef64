#include <ddp/stop_signal.h>

#include "util/environment.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace ddp {

namespace {

constexpr std::array<int, 3> kSignals = {SIGTERM, SIGUSR1, SIGUSR2};

// Written by the handler: only volatile sig_atomic_t is safe there. The time is stored before
// the signal number, so a reader that sees the number sees the time.
volatile std::sig_atomic_t received = 0;
volatile std::sig_atomic_t received_sec = 0;
volatile std::sig_atomic_t received_nsec = 0;

// Nesting count: ddp::cli::run and each Trainer's StopAgreement install them, from any thread.
std::mutex installing;
int installed = 0;
std::array<struct sigaction, kSignals.size()> previous{};

// Set at the first install: this process was started by Open MPI's mpirun (on its own node) or
// by an orted it started (on the others), i.e. its parent is ORTE's launcher.
volatile std::sig_atomic_t parent_is_orte = 0;
volatile std::sig_atomic_t stopping = 0;  // mark_stopping()

// Whether a SIGTERM is ORTE ending the job (stop_signal.h): ORTE sends its children SIGTERM, then
// SIGKILL about a second later, and mpirun reports a failure whatever they return, so catching it
// only made the survivors of a crash wait for the SIGKILL. A stop already under way (a stop
// signal first, or mark_stopping) may still save or finish before it, so it is caught then.
bool launcher_is_ending_the_job(int signal, const siginfo_t* info) {
  return signal == SIGTERM && parent_is_orte && received == 0 && stopping == 0 && info != nullptr &&
         info->si_code == SI_USER && info->si_pid == getppid();  // getppid: async-signal-safe
}

extern "C" void on_stop_signal(int signal, siginfo_t* info, void*) {
  if (launcher_is_ending_the_job(signal, info)) {
    // The default action, now: SIGTERM is blocked while this handler runs, so the raised one
    // is delivered, and kills, when it returns. sigaction and raise are async-signal-safe.
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    sigaction(SIGTERM, &fallback, nullptr);
    raise(SIGTERM);
    return;
  }
  if (received != 0) return;  // the first one counts
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe (POSIX)
  received_sec = static_cast<std::sig_atomic_t>(now.tv_sec);
  received_nsec = static_cast<std::sig_atomic_t>(now.tv_nsec);
  received = signal;
}

}  // namespace

StopSignalHandlers::StopSignalHandlers() {
  std::lock_guard<std::mutex> lock(installing);
  // What ORTE's mpirun and orted put in their children's environment (not srun, not MPI_Init).
  // Read at every install, not only the first: before main (DDP_STOP_HANDLERS_BEFORE_MAIN) the
  // C library has not set `environ` up yet and this reads nothing; ddp::cli::run's install, in
  // main, then reads it.
  parent_is_orte = current_environment().count("OMPI_MCA_orte_launch") > 0;
  if (installed++ > 0) return;
  struct sigaction action {};
  action.sa_sigaction = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_SIGINFO;  // interrupted reads, writes and waits carry on
  for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &action, &previous[i]);
}

StopSignalHandlers::~StopSignalHandlers() {
  std::lock_guard<std::mutex> lock(installing);
  if (--installed > 0) return;
  for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous[i], nullptr);
}

void install_stop_handlers_for_life() {
  // Before main (DDP_STOP_HANDLERS_BEFORE_MAIN): only the C library and what needs no
  // initialiser of its own may be used; the constructor takes a constant-initialised mutex,
  // reads the environment and calls sigaction. Leaked on purpose: never removed.
  new StopSignalHandlers();
}

int stop_signal() { return received; }

double seconds_since_stop_signal() {
  if (received == 0) return -1;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec - received_sec) +
         1e-9 * static_cast<double>(now.tv_nsec - received_nsec);
}

void clear_stop_signal() {
  received = 0;
  stopping = 0;
}

void mark_stopping() { stopping = 1; }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default: {
      static thread_local char text[24];
      std::snprintf(text, sizeof text, "signal %d", signal);
      return text;
    }
  }
}

}  // namespace ddp

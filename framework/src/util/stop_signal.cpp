#include <ddp/stop_signal.h>

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

// Nesting count: each replica thread's Trainer installs them (parallel/replicas.h).
std::mutex installing;
int installed = 0;
std::array<struct sigaction, kSignals.size()> previous{};

extern "C" void on_stop_signal(int signal) {
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
  if (installed++ > 0) return;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // interrupted reads, writes and waits carry on
  for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &action, &previous[i]);
}

StopSignalHandlers::~StopSignalHandlers() {
  std::lock_guard<std::mutex> lock(installing);
  if (--installed > 0) return;
  for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous[i], nullptr);
}

int stop_signal() { return received; }

double seconds_since_stop_signal() {
  if (received == 0) return -1;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec - received_sec) +
         1e-9 * static_cast<double>(now.tv_nsec - received_nsec);
}

void clear_stop_signal() { received = 0; }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: {
      static thread_local char text[24];
      std::snprintf(text, sizeof text, "signal %d", signal);
      return text;
    }
  }
}

}  // namespace ddp

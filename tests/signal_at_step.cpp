// A test build of an example program (ddp_mnist or ddp_cifar: DDP_SIGNAL_EXAMPLE names it) that
// raises a signal at a known optimizer step, so that the shell tests can say where the ranks must
// stop (preempt_resume_check.sh, rank_faults_check.sh, cluster/test_slurm.sh). The first argument
// is the signal:
//
//   mpirun -np 2 ddp_cifar_signal_at_step --signal-at-step=9:1:TERM <ddp_cifar's flags>
//
// Rank RANK raises SIGNAL (TERM, USR1, USR2; KILL for a crash without warning, STOP for a hung
// rank) on itself right after optimizer step STEP (TrainerOptions::on_step), saying so on stderr
// first, so that a test can time the job's end from that line. The rest is the example as built.
#include "cifar_example.h"
#include "mnist_example.h"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace {

struct SignalAt {
  int64_t step = 0;
  int rank = 0;
  int signal = 0;
};

// "--signal-at-step=STEP:RANK:SIGNAL", e.g. 5:1:TERM.
SignalAt parse(const char* argument) {
  const std::string prefix = "--signal-at-step=";
  const std::string text = argument ? argument : "";
  const auto bad = [&] {
    return std::invalid_argument("expected " + prefix + "STEP:RANK:SIGNAL as the first argument (SIGNAL: "
                                 "TERM, USR1, USR2, KILL or STOP), got '" + text + "'");
  };
  if (text.compare(0, prefix.size(), prefix) != 0) throw bad();
  const std::string value = text.substr(prefix.size());
  const size_t a = value.find(':'), b = a == std::string::npos ? a : value.find(':', a + 1);
  if (b == std::string::npos) throw bad();
  SignalAt at;
  try {
    at.step = std::stoll(value.substr(0, a));
    at.rank = std::stoi(value.substr(a + 1, b - a - 1));
  } catch (const std::exception&) {
    throw bad();
  }
  const std::string name = value.substr(b + 1);
  at.signal = name == "TERM"   ? SIGTERM
              : name == "USR1" ? SIGUSR1
              : name == "USR2" ? SIGUSR2
              : name == "KILL" ? SIGKILL
              : name == "STOP" ? SIGSTOP
                               : 0;
  if (at.signal == 0 || at.step < 1 || at.rank < 0) throw bad();
  return at;
}

}  // namespace

int main(int argc, char** argv) {
  SignalAt at;
  try {
    at = parse(argc > 1 ? argv[1] : nullptr);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
  // The example sees its own flags only.
  argv[1] = argv[0];
  const auto adjust = [at](ddp::TrainerOptions& options) {
    options.on_step = [at](int64_t step, int rank) {
      if (step != at.step || rank != at.rank) return;
      std::fprintf(stderr, "signal_at_step: rank %d raises signal %d after step %lld\n", rank,
                   at.signal, static_cast<long long>(step));
      std::fflush(stderr);
      std::raise(at.signal);
    };
  };
  return DDP_SIGNAL_EXAMPLE(argc - 1, argv + 1, ddp::cli::Parallelism::DataParallel, adjust);
}

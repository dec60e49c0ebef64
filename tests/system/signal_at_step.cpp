// A test build of an example program (ddp_mnist or ddp_cifar: DDP_SIGNAL_EXAMPLE names it) that
// raises a signal at a known optimizer step, so that the shell tests can say where the ranks must
// stop (preempt_resume_check.sh, rank_faults_check.sh, tests/cluster/test_slurm.sh). The first
// arguments are the signals:
//
//   mpirun -np 2 ddp_cifar_signal_at_step --signal-at-step=9:1:TERM <ddp_cifar's flags>
//
// Rank RANK raises SIGNAL (TERM, USR1, USR2; KILL for a crash without warning, STOP for a hung
// rank) on itself right after optimizer step STEP (testing::hooks().after_step), saying so on
// stderr first, so that a test can time the job's end from that line. SIGNAL may also be
// SLEEP<SECONDS> (SLEEP2.5): the rank sleeps there instead, a slow step on one rank (the timed
// snapshots' agreement, snapshot_cost_check.sh). Several --signal-at-step arguments may come first,
// each acting once (e.g. a SLEEP, then a KILL later). STEP may also name a phase of start-up, where
// no Trainer exists yet:
//   init   inside MPI_Init_thread, before MPI starts (a profiling-interface wrapper of this
//          program's own; the rank is the launcher's OMPI_COMM_WORLD_RANK / PMIX_RANK);
//   setup  after the data loading and the DistributedDataParallel constructor, when the example
//          makes the Trainer's options.
// The rest is the example as built. Without --signal-at-step it is the example with the testing
// hooks of tests/system/testing_hooks_from_env.cpp (DDP_TEST_SAMPLE_LOG, DDP_TEST_STOP_IN_PHASE,
// DDP_TEST_HOST_SPLIT), which it links.
#include "cifar_example.h"
#include "mnist_example.h"

#include "util/testing_hooks.h"

#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kInit = -1, kSetup = -2;  // the phases of start-up, as steps

struct SignalAt {
  int64_t step = 0;
  int rank = 0;
  int signal = 0;  // 0: a SLEEP
  double sleep_seconds = 0;
};

SignalAt g_at;  // for the MPI_Init_thread wrapper

// The rank the launcher gave this process (MPI may not be running yet), -1 if none.
int launcher_rank() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!rank) rank = std::getenv("PMIX_RANK");
  return rank ? std::atoi(rank) : -1;
}

void raise_at(const SignalAt& at, const char* where) {
  if (at.signal == 0) {
    std::fprintf(stderr, "signal_at_step: rank %d sleeps %g s %s\n", at.rank, at.sleep_seconds,
                 where);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(at.sleep_seconds));
    return;
  }
  std::fprintf(stderr, "signal_at_step: rank %d raises signal %d %s\n", at.rank, at.signal, where);
  std::fflush(stderr);
  std::raise(at.signal);
}

// "--signal-at-step=STEP:RANK:SIGNAL", e.g. 5:1:TERM.
SignalAt parse(const char* argument) {
  const std::string prefix = "--signal-at-step=";
  const std::string text = argument ? argument : "";
  const auto bad = [&] {
    return std::invalid_argument("expected " + prefix +
                                 "STEP:RANK:SIGNAL (SIGNAL: "
                                 "TERM, USR1, USR2, KILL, STOP or SLEEP<SECONDS>), got '" +
                                 text + "'");
  };
  if (text.compare(0, prefix.size(), prefix) != 0) throw bad();
  const std::string value = text.substr(prefix.size());
  const size_t a = value.find(':'), b = a == std::string::npos ? a : value.find(':', a + 1);
  if (b == std::string::npos) throw bad();
  SignalAt at;
  try {
    const std::string step = value.substr(0, a);
    at.step = step == "init" ? kInit : step == "setup" ? kSetup : std::stoll(step);
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
  if (name.compare(0, 5, "SLEEP") == 0) {
    try {
      at.sleep_seconds = std::stod(name.substr(5));
    } catch (const std::exception&) {
      throw bad();
    }
    if (!(at.sleep_seconds > 0) || at.step <= 0 || at.rank < 0) throw bad();  // after a step only
    return at;
  }
  if (at.signal == 0 || at.step == 0 || at.step < kSetup || at.rank < 0) throw bad();
  return at;
}

}  // namespace

// The MPI profiling interface: this definition comes before the MPI library's, so ddp::Runtime's
// call lands here (the executable exports it: ENABLE_EXPORTS in tests/CMakeLists.txt).
extern "C" int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  if (g_at.step == kInit && launcher_rank() == g_at.rank) raise_at(g_at, "inside MPI_Init_thread");
  return PMPI_Init_thread(argc, argv, required, provided);
}

int main(int argc, char** argv) {
  std::vector<SignalAt> actions;
  try {
    while (argc > 1 && std::strncmp(argv[1], "--signal-at-step=", 17) == 0) {
      actions.push_back(parse(argv[1]));
      // The example sees its own flags only.
      argv[1] = argv[0];
      --argc;
      ++argv;
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
  if (!actions.empty()) g_at = actions.front();
  for (const SignalAt& at : actions) {
    if (at.step == kInit && &at != &actions.front()) {
      std::fprintf(stderr, "%s: the init phase must be the first --signal-at-step\n", argv[0]);
      return 2;
    }
  }
  // The example calls it on every rank when it makes the Trainer's options.
  const auto adjust = [actions](ddp::TrainerOptions&) {
    for (const SignalAt& at : actions) {
      if (at.step == kSetup && launcher_rank() == at.rank) raise_at(at, "before the Trainer");
    }
  };
  if (!actions.empty()) {
    ddp::testing::hooks().after_step = [actions](int64_t step, int rank) {
      for (const SignalAt& at : actions) {
        if (step != at.step || rank != at.rank) continue;
        const std::string where = "after step " + std::to_string(step);
        raise_at(at, where.c_str());
      }
    };
  }
  return DDP_SIGNAL_EXAMPLE(argc, argv, ddp::cli::Parallelism::DataParallel, adjust);
}

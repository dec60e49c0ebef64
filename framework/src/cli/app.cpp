#include <ddp/cli/app.h>

#include <ddp/cli/finish.h>

#include <ddp/communicator.h>
#include <ddp/process_group.h>
#include <ddp/runtime.h>
#include <ddp/stop_signal.h>
#include <ddp/train/stop_agreement.h>

#include "cli/flag_agreement.h"

#include <boost/program_options.hpp>
#include <torch/utils.h>

#include <iostream>
#include <stdexcept>
#include <string>

namespace po = boost::program_options;

namespace ddp::cli {

namespace {

// For a SingleProcess program started as several ranks: which to use instead.
std::string instead(const Program& program) {
  if (program.data_parallel_program.empty()) return "";
  return ": use " + program.data_parallel_program + " for data-parallel training";
}

// Collective: whether a rank got a stop signal before training began (from the start of run()
// through MPI_Init and the communicators), agreed by every rank (StopAgreement). Nothing is
// trained yet, so the same command can simply start again: rank 0 says so and the program
// exits 75. A signal after this check reaches the Trainer's check before its first step.
bool stopped_during_start_up(ddp::ProcessGroup& group) {
  ddp::StopAgreement stop(group);
  if (!stop.should_stop(0)) return false;
  if (group.is_main()) {
    std::cout << "Stopped by " << stop.describe() << " during start-up, before training: nothing "
              << "to save\nExit status " << ddp::kStoppedExitCode << ": stopped early by "
              << ddp::stop_signal_name(stop.signal()) << "; run the same command again"
              << std::endl;
  }
  return true;
}

}  // namespace

int run(int argc, char** argv, const Program& program, const po::options_description& options,
        const TrainingFlags& flags, const std::function<int(ddp::ProcessGroup&)>& train,
        const std::function<void()>& check_flags) {
  // The stop handlers for the program's whole life, first: a SIGTERM, SIGUSR1 or SIGUSR2 during
  // start-up (MPI_Init, data loading, the DistributedDataParallel constructor) only sets the
  // flag, and the ranks stop together at the first check below or in the Trainer, exiting 75;
  // by default it would kill them (138 for SIGUSR1), and the job would not be requeued. Declared
  // before the Runtime, they outlive MPI_Finalize: a second signal while a stopped program
  // finishes cannot turn its 75 into 143.
  const ddp::StopSignalHandlers stop_handlers;
  const std::string& name = program.name;
  const Parallelism parallelism = program.parallelism;
  // Flags first: they decide the device the Runtime picks. Their values are checked here too,
  // before any data is read, so a bad value costs no time.
  po::variables_map vm;
  std::string flag_error;
  po::parsed_options parsed(&options);
  try {
    parsed = po::parse_command_line(argc, argv, options);
    po::store(parsed, vm);
    po::notify(vm);
    if (!vm.count("help")) {
      check_training_flags(flags);
      if (check_flags) check_flags();
    }
  } catch (const po::error& e) {
    flag_error = e.what();
  } catch (const std::invalid_argument& e) {
    flag_error = e.what();
  }
  if (flag_error.empty() && flags.deterministic) use_deterministic_kernels();  // before CUDA starts
  // Checked flags give the Runtime its options, --timeout among them (it bounds MPI start-up).
  ddp::RuntimeOptions start;
  if (flag_error.empty() && !vm.count("help")) {
    start = runtime_options(flags);
  } else if (flag_error.empty()) {
    start.use_cuda = !flags.no_cuda;  // --help: the other flags are unchecked, their defaults
  } else {
    start.use_cuda = false;  // a bad flag: the CPU, no banner, only the message
    start.print_banner = false;
  }
  ddp::Runtime runtime(argc, argv, start);
  const bool help = flag_error.empty() && vm.count("help");
  // What the ranks compare first (flag_agreement.h): a rank with a bad flag sends its error.
  const std::string fingerprint = flag_error.empty()
                                      ? flags_fingerprint_text(name, vm, parsed)
                                      : flags_error_text(name, flag_error + " (see --help)");
  int status = 0;
  const int aborted = ddp::run_or_abort(runtime, [&] {
    const bool checked = flag_error.empty() && !help;
    // A bad flag or --help (flags unchecked): the defaults, so that every rank gets as far as
    // the flag agreement.
    const ddp::ProcessGroupOptions group_options =
        checked ? process_group_options(flags) : ddp::ProcessGroupOptions{};
    if (checked && parallelism == Parallelism::SingleProcess && runtime.world_size() > 1) {
      throw std::runtime_error(name + " trains in one process but was started as " +
                               std::to_string(runtime.world_size()) + " ranks" + instead(program));
    }
    ddp::ProcessGroup group(runtime, group_options);
    // Before anything that depends on the flags, so that ranks started with different ones
    // (or a bad one on some ranks only) stop here instead of failing later in a collective.
    const std::string differ = agree_on_flags(group.cpu(), fingerprint);
    if (!differ.empty() || !flag_error.empty()) {
      // Every rank stops here; rank 0 explains.
      if (group.is_main()) {
        std::cerr << name << ": " << (differ.empty() ? flag_error + " (see --help)" : differ)
                  << "\n";
      }
      status = 2;
      return;
    }
    if (help) {
      if (group.is_main()) {
        std::cout << "Usage: " << (parallelism == Parallelism::DataParallel ? "mpirun -np N " : "")
                  << name << " [options]\n"
                  << program.description << "\n\n"
                  << options << "\n";
      }
      return;
    }
    if (stopped_during_start_up(group)) {
      status = ddp::kStoppedExitCode;
      return;
    }
    if (flags.show_topology) {
      const auto lines = ddp::all_gather_strings(group.cpu(), runtime.summary());
      if (group.is_main()) {
        for (const auto& line : lines) std::cout << line << "\n";
      }
    }
    // --help promises it: the model's initial weights too, when `train` builds the model.
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    status = run_training(group, train);  // finish.h: a diverged run's status
  });
  return aborted ? aborted : status;
}

}  // namespace ddp::cli

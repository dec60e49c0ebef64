#pragma once
/// \file
/// The start-up and run helper of a training program, which gets the order right:
///  1. Parse and check the flags before the Runtime: --no-cuda decides its device, and a bad value
///     then costs no time and reads no data.
///  2. Start the Runtime (MPI), then compare the ranks' flags (src/cli/flag_agreement.h). Ranks
///     started with different flags, or a flag error on any rank, stop with status 2, rank 0 alone
///     saying `<name>: <error> (see --help)` or naming the first differing setting and its ranks;
///     --help: rank 0 prints the usage, status 0.
///  3. Run the body under ddp::run_or_abort (an exception on one rank ends the whole job, naming
///     the rank), with the ProcessGroup (with --timeout's collective timeout).
///
///   ddp::cli::TrainingFlags flags;
///   boost::program_options::options_description options("My model");
///   ddp::cli::add_training_flags(options, flags, {64, 10, 0.1, "data", "my data set", "my.pt"});
///   return ddp::cli::run(argc, argv, {"my_train", "Trains my model."}, options, flags,
///                        [&](ddp::ProcessGroup& group) { ...; return 0; });

#include <ddp/cli/training_flags.h>
#include <ddp/process_group.h>

#include <boost/program_options/options_description.hpp>

#include <functional>
#include <string>

namespace ddp::cli {

/// What ddp::cli::run says of the program: its name and usage text, and how it runs.
struct Program {
  std::string name;         ///< begins every error line; in the usage line
  std::string description;  ///< the usage's second line
  Parallelism parallelism = Parallelism::DataParallel;  ///< SingleProcess: one rank only
  /// For a SingleProcess program: the program to use instead for several ranks (named in the
  /// error), or empty.
  std::string data_parallel_program;
};

/// The whole program around `train`: parses `options` (the training flags of `flags`, added with
/// add_training_flags, and the program's own), checks them (check_training_flags, then
/// `check_flags` for the program's own: it throws std::invalid_argument naming the flag), starts
/// the Runtime, refuses several ranks for a SingleProcess program, checks that every rank has the
/// same flags, answers --help, prints every rank's place with --show-topology, seeds LibTorch
/// with --seed (torch::manual_seed: the weights of a model `train` builds), and runs `train`
/// once under run_or_abort. Returns the exit code: 2 for a bad flag or flags that differ between
/// ranks, 0 for --help, `train`'s when it returns, or run_or_abort's.
int run(int argc, char** argv, const Program& program,
        const boost::program_options::options_description& options, const TrainingFlags& flags,
        const std::function<int(ddp::ProcessGroup&)>& train,
        const std::function<void()>& check_flags = {});

}  // namespace ddp::cli

// A program on ddp::cli from an install prefix: the training flags parsed before the Runtime,
// --help and flag errors from rank 0, the body once under run_or_abort, seeded with --seed.
#include <ddp/cli/app.h>
#include <ddp/cli/training_flags.h>

#include <torch/torch.h>

#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
  ddp::cli::TrainingFlags flags;
  boost::program_options::options_description options("consumer_cli");
  ddp::cli::add_training_flags(options, flags,
                               {32, 5, 0.1, "data", "where the data would be", "consumer.pt"});
  return ddp::cli::run(argc, argv, {"consumer_cli", "Prints the flags it was given."}, options,
                       flags, [&](ddp::ProcessGroup& group) {
                         const double draw = torch::rand({1}).item<double>();  // as a model's init
                         if (group.is_main()) {
                           std::cout << "consumer_cli: epochs " << flags.epochs << ", batch size "
                                     << flags.batch_size << ", " << group.size() << " rank(s)"
                                     << std::endl;
                           std::printf("consumer_cli: first draw %.6f\n", draw);
                         }
                         return 0;
                       });
}

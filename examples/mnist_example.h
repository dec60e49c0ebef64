#pragma once
// What `mnist` and `ddp_mnist` share: flags, data, model, optimizer and the training loop.
// They differ only in whether the model is wrapped in ddp::DistributedDataParallel.

#include <ddp/cli/training_flags.h>

// The whole program: parses flags, trains, returns the exit code.
int run_mnist_example(int argc, char** argv, ddp::cli::Parallelism parallelism);

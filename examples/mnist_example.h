#pragma once
// What `mnist` and `ddp_mnist` share: flags, data, model, optimizer and the training loop.
// They differ only in whether the model is wrapped in ddp::DistributedDataParallel.

#include <ddp/cli/training_flags.h>
#include <ddp/train/trainer.h>

#include <functional>

// The whole program: parses flags, trains, returns the exit code. `adjust`, when given, changes
// the Trainer's options last (a test build raises a signal before the Trainer).
int run_mnist_example(int argc, char** argv, ddp::cli::Parallelism parallelism,
                      const std::function<void(ddp::TrainerOptions&)>& adjust = {});

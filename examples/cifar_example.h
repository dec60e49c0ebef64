#pragma once
// What `cifar` and `ddp_cifar` share: CIFAR-10 data with augmentation, a small CNN or
// ResNet-18, SGD with momentum and weight decay under a cosine or step schedule, checkpoints
// and resume. They differ only in whether the model is wrapped in ddp::DistributedDataParallel.

#include <ddp/cli/training_flags.h>
#include <ddp/train/trainer.h>

#include <functional>

// The whole program: parses flags, trains, returns the exit code. `adjust`, when given, changes
// the Trainer's options last (a test build raises a signal before the Trainer).
int run_cifar_example(int argc, char** argv, ddp::cli::Parallelism parallelism,
                      const std::function<void(ddp::TrainerOptions&)>& adjust = {});

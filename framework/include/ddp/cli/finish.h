#pragma once
/// \file
/// The end of a ddp::cli program's training body: the collective work that every rank must do
/// (the Timeline's write: skip it on one rank and the job hangs), the exit status of a run that a
/// stop signal ended or that diverged, and --save-model.

#include <ddp/cli/training_flags.h>
#include <ddp/process_group.h>
#include <ddp/timeline.h>
#include <ddp/train/trainer.h>

#include <torch/torch.h>

#include <functional>

namespace ddp::cli {

/// Call on every rank after training: writes the timeline (collective; rank 0 writes
/// --timeline) and, with --save-model, the weights to `defaults.model_file` (rank 0). Returns the
/// exit code: 0, or ddp::kStoppedExitCode when a stop signal ended training early (no model is
/// saved then: it is not trained yet).
int finish(ddp::ProcessGroup& group, const TrainingFlags& flags, const TrainingDefaults& defaults,
           ddp::Timeline* timeline, const torch::nn::Module& model, const ddp::Trainer& trainer);

/// Runs a training body (ddp::cli::run does). ddp::TrainingDiverged ends with
/// ddp::kDivergedExitCode, rank 0 printing the message and the flags that help, instead of an
/// abort; ddp::GlobalBatchNotDivisible ends with 2, as a bad flag, rank 0 naming
/// --keep-global-batch and the numbers; anything else propagates.
int run_training(ddp::ProcessGroup& group, const std::function<int(ddp::ProcessGroup&)>& train);

}  // namespace ddp::cli

#pragma once
/// \file
/// Training that diverged: a loss or gradient that is not finite (NaN or inf), usually a learning
/// rate too high, sometimes bad data. Without a check, a run trains on NaN to the end, exits 0 and
/// writes NaN checkpoints (rotating the good ones out). The Trainer (trainer.h) checks every step
/// and stops (or drops the step: OnNonFinite); the Checkpointer (checkpointer.h) refuses to write
/// a model whose parameters are not finite, for any loop.
///
/// How the ranks agree without a message of their own: after DistributedDataParallel's backward
/// every rank holds the same averaged gradients, so a local check of them gives the same answer
/// everywhere (and a NaN on one rank's gradients reaches all of them through the average). A
/// loss is per rank: its flag rides on the stop agreement's all-reduce at the next step boundary
/// (StepBoundary::at_step) and on the epoch's reduction of the loss sums (EpochMeter).
///
///   try {
///     trainer.fit(epochs);
///   } catch (const ddp::TrainingDiverged& e) {   // every rank, at the same step
///     if (group.is_main()) std::cerr << e.what() << "\n";
///     return ddp::kDivergedExitCode;              // 3
///   }

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

/// The exit status of a run that stopped because training diverged. Not 0 (done), 1 (an error), 2
/// (a bad flag) nor 75 (kStoppedExitCode: stopped, resume me): resuming would diverge again.
constexpr int kDivergedExitCode = 3;

/// What the Trainer does at a step whose gradients are not finite (TrainerOptions::on_nonfinite).
enum class OnNonFinite {
  Stop,  ///< fit() throws TrainingDiverged on every rank, before the optimizer step
  Skip,  ///< the optimizer step is dropped (as GradScaler drops one); after
         /// TrainerOptions::max_skipped_steps such steps in a row, Stop
};

/// "stop" or "skip"; std::invalid_argument listing them otherwise.
OnNonFinite parse_on_nonfinite(const std::string& name);

/// Thrown on every rank at the same point when training diverged; what() says where and what.
class TrainingDiverged : public std::runtime_error {
 public:
  /// `message` becomes what(); `step` and `epoch` as their getters say.
  TrainingDiverged(const std::string& message, int64_t step, int64_t epoch)
      : std::runtime_error(message), step_(step), epoch_(epoch) {}
  int64_t step() const { return step_; }    ///< the optimizer step (global, 1-based) that diverged
  int64_t epoch() const { return epoch_; }  ///< the epoch it happened in (1-based)

 private:
  int64_t step_;
  int64_t epoch_;
};

/// The largest absolute value over the gradients of `parameters` (0 when none has one): NaN or
/// inf exactly when some gradient element is, and, unlike a 2-norm, it never overflows. Reads the
/// gradients only (one pass; on a GPU it waits for them).
double largest_abs_gradient(const std::vector<torch::Tensor>& parameters);

/// The name of the first parameter or buffer of `module` holding a NaN or inf, or "" when all
/// are finite.
std::string first_nonfinite_tensor(const torch::nn::Module& module);

}  // namespace ddp

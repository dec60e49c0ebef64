#pragma once
/// \file
/// Training that diverged: a loss or gradient that is not finite (NaN or inf), usually a learning
/// rate too high, sometimes bad data. Without a check, a run trains on NaN to the end, exits 0 and
/// writes NaN checkpoints (rotating the good ones out). The policy:
/// - Gradients: after DistributedDataParallel's backward every rank holds the same averaged
///   gradients (a NaN on one rank reaches all through the average), so a local check before the
///   optimizer step (their largest |value|, or clip_grad_norm's total norm when clipping) decides
///   alike everywhere, without a message. OnNonFinite says what follows. Under AmpMode::Fp16 the
///   GradScaler's own skip handles them; they are neither checked again nor counted.
/// - A loss is per rank and always stops: its flag rides on the stop agreement at the next step
///   boundary and at the epoch's end (StepBoundary::at_step, end_epoch), before evaluation and the
///   epoch's snapshot; by then the step was taken.
/// - An update of finite gradients that overflows shows in the next step's gradients; at an
///   epoch's end the parameters are read once, and the Checkpointer never writes non-finite ones.
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
  Skip,  ///< the step is dropped and said (the schedule and step count still advance, as with
         /// GradScaler); after TrainerOptions::max_skipped_steps in a row, Stop
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

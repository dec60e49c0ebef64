#pragma once
/// \file
/// Learning-rate schedules stepped once per optimizer step: an optional linear warmup, then a
/// constant rate, a cosine decay or a step decay, with an optional linear scaling of the base rate
/// with the global batch. (lr_scheduler.h holds the schedules stepped once per epoch.)
///
/// The rate of step t (counting from 0) for a parameter group of base rate `base` (the optimizer's
/// rate at construction, times global_batch / reference_batch when scaling is on), u = t - W:
///   t < W:     base * (f + (1 - f) * t / W)                          LinearLR(f, total_iters=W)
///   Constant:  base
///   Cosine:    min_lr + (base - min_lr) * (1 + cos(pi * u / T)) / 2  CosineAnnealingLR(T, min_lr)
///   Step:      base * gamma^floor(u / step_size)                     StepLR
/// as PyTorch's SequentialLR([LinearLR, ...], milestones=[W]) stepped after every optimizer.step()
/// (the cosine rises again past T, as PyTorch's does). The closed form depends only on t and the
/// base, so a schedule restored from save() continues exactly.
///
/// Use: build it after the optimizer (it sets the rates of step 0), call step() after every
/// optimizer.step(). With gradient accumulation, step it once per optimizer step, not per
/// micro-batch. Every rank steps the same schedule, so the rates agree without communication.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

/// What follows the warmup (the formulas above): the base rate, a cosine decay or a step decay.
enum class LRDecay { Constant, Cosine, Step };

///@{
/// "constant", "cosine", "step"; parse_lr_decay throws std::invalid_argument naming the text.
LRDecay parse_lr_decay(const std::string& text);
///@}

/// The schedule's shape (the file's text gives the formulas); LRSchedule checks each field.
struct LRScheduleOptions {
  int64_t warmup_steps = 0;          ///< W; 0: no warmup
  double warmup_start_factor = 0.1;  ///< f: the first step's rate is f * base; 0 < f <= 1
  /// What follows the warmup.
  LRDecay decay = LRDecay::Constant;
  int64_t decay_steps = 0;  ///< Cosine: T, steps from the end of warmup down to min_lr
  double min_lr = 0.0;      ///< Cosine: the rate reached after T steps
  int64_t step_size = 1;    ///< Step: steps between decays
  double gamma = 0.1;       ///< Step: factor per decay
  ///@{
  /// Linear scaling rule: base = optimizer rate * global_batch / reference_batch (0: no scaling;
  /// global_batch_size() below).
  int64_t reference_batch = 0;
  int64_t global_batch = 0;
  ///@}
};

/// The linear scaling rule (Goyal et al., "Accurate, Large Minibatch SGD"): a rate tuned for a
/// global batch of `reference_batch` samples becomes lr * global_batch / reference_batch for a
/// global batch of `global_batch`. reference_batch 0: no scaling, `lr` itself.
/// std::invalid_argument naming the argument: reference_batch < 0, global_batch < 1 (with scaling
/// on), lr not finite.
double scale_lr_with_batch(double lr, int64_t global_batch, int64_t reference_batch);
/// The same for every parameter group of `optimizer`: call it once, before building a schedule on
/// the optimizer (LRSchedule and the per-epoch schedulers take its rates as their base). Use this
/// or LRScheduleOptions::reference_batch, not both.
void scale_lr_with_batch(torch::optim::Optimizer& optimizer, int64_t global_batch,
                         int64_t reference_batch);
/// The samples of one optimizer step over all ranks: batch_size (per rank) * ranks * accumulate
/// (micro-batches per step). std::invalid_argument naming the argument when one is < 1.
int64_t global_batch_size(int64_t batch_size, int64_t ranks, int64_t accumulate);

/// A per-step schedule on an optimizer's parameter groups (the file's text); it sets their
/// rates, and must not outlive the optimizer.
class LRSchedule {
 public:
  /// Reads the base rates from `optimizer`'s parameter groups, scales them, and sets the rates of
  /// step 0. std::invalid_argument for an option out of range, naming it
  /// (LRScheduleOptions::warmup_steps, ...).
  LRSchedule(torch::optim::Optimizer& optimizer, LRScheduleOptions options);

  /// After an optimizer step: sets the rates of the next step.
  void step();
  /// Optimizer steps taken (the t of the rates now set).
  int64_t position() const { return position_; }
  /// The rate of step t for each parameter group.
  std::vector<double> lrs_at(int64_t t) const;
  /// The base rates after scaling.
  const std::vector<double>& base_lrs() const { return base_lrs_; }

  ///@{
  /// save() writes the position and the base rates; load() restores the position and sets the
  /// optimizer's rates of that position from this schedule's own base rates, so that a resumed
  /// run follows its own schedule (other base rates or options take effect; the same ones
  /// continue exactly). Build the schedule before loading the optimizer's state: its base is the
  /// optimizer's rates at construction. load() throws std::runtime_error when the archive's
  /// parameter groups differ in number from the optimizer's.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  ///@}

 private:
  void apply();

  torch::optim::Optimizer& optimizer_;
  LRScheduleOptions options_;
  std::vector<double> base_lrs_;
  int64_t position_ = 0;
};

}  // namespace ddp

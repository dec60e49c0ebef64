#pragma once
/// \file
/// The training loop for any model, batch type and loss: a task (task.h) gathers batches and
/// computes their loss and metric sums; the Trainer shards the data (DistributedSampler), runs the
/// step (accumulation, clipping, mixed precision, a per-step schedule) and composes the parts a
/// hand-written loop uses too: StepBoundary, Reporter, EpochMeter, DataSource
/// (docs/training_loop.md). The same Trainer runs a single process (no DistributedDataParallel).
///
///   MyTask task(...);                                     // a Task<Batch>
///   ddp::TrainerOptions options;
///   options.batch_size = 64;
///   ddp::Trainer trainer(group, *net, task, optimizer, options, &model);
///   trainer.fit(epochs);        // throws TrainingDiverged (exit with kDivergedExitCode)
///   return trainer.stopped_by() ? ddp::kStoppedExitCode : 0;
///
/// Invariants: every rank builds the same Trainer and makes the same calls in the same order; the
/// group, model, task, optimizer and wrapper must outlive it.

#include <ddp/distributed_data_parallel.h>
#include <ddp/distributed_sampler.h>
#include <ddp/process_group.h>
#include <ddp/timeline.h>
#include <ddp/train/autocast.h>
#include <ddp/train/checkpointer.h>
#include <ddp/train/divergence.h>
#include <ddp/train/grad_scaler.h>
#include <ddp/train/lr_schedule.h>
#include <ddp/train/metrics.h>
#include <ddp/train/reporter.h>
#include <ddp/train/step_boundary.h>
#include <ddp/train/task.h>

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

/// How the Trainer trains: batches, the step, precision, non-finite handling, and its parts'
/// options (reporting, checkpoints). The constructor checks them, naming the field.
struct TrainerOptions {
  int64_t batch_size = 64;          ///< per rank
  int64_t test_batch_size = 1000;   ///< per rank
  int64_t limit_train_batches = 0;  ///< per epoch; 0: the whole shard
  bool dry_run = false;             ///< one batch per epoch, one epoch
  /// A new order of the data set every epoch (DistributedSampler's shuffle); false: in order.
  bool shuffle = true;
  int64_t seed = 0;              ///< seeds the sampler's permutation and the task's generator
  Timeline* timeline = nullptr;  ///< records data/forward/backward/optimizer spans when set
  /// Every N optimizer steps, verify bit for bit that all replicas hold the same parameters and
  /// buffers (replica_check.h); a difference stops the job naming the tensor and ranks. 0: never.
  int64_t check_sync_every = 0;

  /// Micro-batches per optimizer step: backward runs under DistributedDataParallel::no_sync() on
  /// all but the last of each group, and each micro-batch's loss is divided by `accumulate`, so a
  /// step sees the mean over batch_size * ranks * accumulate samples. An epoch's last group may be
  /// shorter. Stop checks, replica checks and snapshots happen only between groups. 1: a step per
  /// batch.
  int64_t accumulate = 1;
  /// > 0: the gradients are clipped to this global 2-norm (clip_grad_norm) before every step.
  double clip_grad_norm = 0;
  /// The forward and the loss under Autocast on the rank's device: bf16, or fp16 with a
  /// GradScaler (options below; its state goes into snapshots). Off: fp32.
  AmpMode amp = AmpMode::Off;
  GradScalerOptions grad_scaler;  ///< the fp16 loss scaler's; used only with AmpMode::Fp16
  /// Stepped after every optimizer step (not per epoch), its position saved in snapshots. Built by
  /// the caller on the same optimizer; it must outlive the Trainer. Null: none. fit() refuses a
  /// per-epoch scheduler as well.
  LRSchedule* lr_schedule = nullptr;

  /// A step whose gradients are not finite: divergence.h says what is checked when.
  OnNonFinite on_nonfinite = OnNonFinite::Stop;
  int64_t max_skipped_steps = 10;  ///< >= 1

  /// On resuming from a snapshot of another number of ranks or per-rank batch size: true sets
  /// batch_size to the snapshot's global batch / this run's ranks, so the global batches and the
  /// steps per epoch (and the schedule) stay; fit() throws GlobalBatchNotDivisible when it does not
  /// divide, std::runtime_error when the snapshot does not record its batch size. False: the global
  /// batch changes with the world size (docs/reliability.md: the linear scaling rule).
  bool keep_global_batch = false;

  ///@{
  /// The parts. `checkpoint.seed` and `checkpoint.batch_size` are set from `seed` and `batch_size`.
  ReporterOptions report;
  CheckpointerOptions checkpoint;
  ///@}
  /// Steps between the stop agreements (step_boundary.h; checkpoint.every_seconds needs it > 0).
  /// 0: none, and the signals keep their default action (the process dies).
  int64_t stop_check_every = 1;
};

/// Thrown by Trainer::fit on every rank alike when TrainerOptions::keep_global_batch cannot keep
/// the resumed snapshot's global batch on this run's ranks: a usage error (ddp::cli exits 2,
/// naming its flag). what() names the option and the numbers.
class GlobalBatchNotDivisible : public std::invalid_argument {
 public:
  /// The snapshot's per-rank batch size and ranks, and this run's ranks.
  GlobalBatchNotDivisible(int64_t snapshot_batch_size, int snapshot_ranks, int ranks);
  int64_t snapshot_batch_size() const { return snapshot_batch_size_; }  ///< per rank
  int snapshot_ranks() const { return snapshot_ranks_; }  ///< the snapshot's run's ranks
  int ranks() const { return ranks_; }                    ///< this run's

 private:
  int64_t snapshot_batch_size_;
  int snapshot_ranks_, ranks_;
};

/// The training loop of the file's text. Its calls are collective.
class Trainer {
 public:
  /// `task` computes the loss running `model` (the module `optimizer` steps and snapshots save);
  /// `ddp` is the wrapper around it, or null for a single process. Checks the options (errors name
  /// the field, e.g. TrainerOptions::batch_size), the task's metric names and the checkpoint
  /// directory; installs the stop handlers. When the wrapper's backward steps `optimizer`
  /// (hook_then_optimizer(), registered before this), the Trainer does not, and refuses
  /// (std::invalid_argument) clip_grad_norm, AmpMode::Fp16 and OnNonFinite::Skip, which need every
  /// gradient before the step; a non-finite gradient then still stops the job before any snapshot,
  /// but the model in memory has taken the step.
  Trainer(ProcessGroup& group, torch::nn::Module& model, TrainingTask& task,
          torch::optim::Optimizer& optimizer, TrainerOptions options,
          DistributedDataParallel* ddp = nullptr);
  ~Trainer();

  /// One pass over this rank's shard of the task's training set (collective). After a stop
  /// inside it, stopped_by() is set and the result is empty (epoch 0).
  EpochResult train_epoch(int64_t epoch);
  /// Exact evaluation over all of the task's test set: each sample is counted once over all ranks,
  /// every rank with rank 0's buffers (DistributedDataParallel::prepare_forward()). Collective.
  Evaluation evaluate();
  /// Epochs 1..epochs (or from the resumed snapshot's position): train, evaluate (when the task
  /// has a test set), report, scheduler->step() if given, then the epoch-end snapshot. Ends with
  /// the summary table and what the snapshots cost, then StepBoundary::end_run's lines (nothing
  /// left to train, a signal after the last step). Returns the epochs it ran to the end. Throws
  /// TrainingDiverged on every rank when training diverged (TrainerOptions::on_nonfinite),
  /// GlobalBatchNotDivisible (TrainerOptions::keep_global_batch). A resumed epoch may be
  /// re-sharded: step_boundary.h.
  std::vector<EpochResult> fit(int64_t epochs, torch::optim::LRScheduler* scheduler = nullptr);

  /// Optimizer steps taken so far, counting those before a resume.
  int64_t global_step() const { return global_step_; }
  /// The fp16 loss scaler (TrainerOptions::amp is Fp16), else null.
  const GradScaler* grad_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  /// Whether backward steps the optimizer (the wrapper's comm hook), so the Trainer does not.
  bool optimizer_step_overlapped() const { return backward_steps_; }
  /// Optimizer steps dropped for non-finite gradients (OnNonFinite::Skip) in this run.
  int64_t skipped_steps() const { return skipped_total_; }
  /// The stop signal that ended the last fit() early (stop_signal.h), 0 when it ran to the end;
  /// then stop_snapshot() is the snapshot it wrote ("" without a checkpoint directory).
  int stopped_by() const { return boundary_.stop().signal(); }
  const std::string& stop_snapshot() const { return stop_snapshot_; }  ///< see stopped_by()

 private:
  ProcessGroup& group_;
  torch::nn::Module& model_;
  TrainingTask& task_;
  torch::optim::Optimizer& optimizer_;
  TrainerOptions options_;
  DistributedDataParallel* ddp_;
  std::optional<GradScaler> scaler_;  ///< with AmpMode::Fp16
  bool backward_steps_ = false;       ///< the wrapper's backward steps optimizer_
  StepBoundary boundary_;  ///< the stop agreement, the Checkpointer, where an epoch starts
  Reporter reporter_;
  std::unique_ptr<DataSource<std::any>> source_;
  DistributedSampler sampler_;
  int64_t global_step_ = 0;
  EpochStart epoch_;  ///< where the epoch in progress started (StepBoundary::start_epoch)
  std::string stop_snapshot_;
  /// The divergence check (divergence.h).
  struct PendingBatch {  ///< a micro-batch's meter entries, added when its group's step is kept
    torch::Tensor loss;
    int64_t samples;
    std::vector<torch::Tensor> sums;
  };
  std::vector<PendingBatch> pending_;
  int64_t nonfinite_loss_step_ = -1;  ///< this rank's first step with a non-finite loss
  int64_t skipped_in_a_row_ = 0, skipped_total_ = 0;
  /// The latest optimizer step's, for the step records (StepScalars): the learning rate it used
  /// and, when clipping, the gradients' 2-norm before clipping.
  std::optional<double> step_lr_, step_grad_norm_;

  int64_t batches_per_epoch() const;  ///< of the whole shard (counted from batch 0 on)
  int64_t batches_to_train() const;   ///< with limit_train_batches and dry_run
  /// After resuming: the per-rank batch size of TrainerOptions::keep_global_batch.
  void keep_global_batch();
  /// The first batch of the epoch epoch_ starts; restores its generator and sums when resumed.
  int64_t restore_epoch(at::Generator& generator, EpochMeter& meter);
  /// At the boundary before batch b (StepBoundary::at_step). True when the ranks stop here.
  bool stop_at(int64_t b, at::Generator& generator, const EpochMeter& meter, double sync_at_start);
  /// Batch `b` of `batches`: data, forward, backward (and the optimizer step at the end of a
  /// group), added to `meter`. Returns the task's output (its loss detached).
  StepOutput step(int64_t epoch, int64_t b, int64_t batches, at::Generator& generator,
                  EpochMeter& meter);
  /// Unscale and clip as configured, check the gradients (divergence.h), step (or skip: fp16
  /// overflow, OnNonFinite::Skip), update the scaler, step the per-step schedule. Returns whether
  /// the optimizer stepped; throws TrainingDiverged (Stop).
  bool optimizer_step(int64_t epoch);
  /// Throws TrainingDiverged saying where, what and the learning rate (every rank alike).
  [[noreturn]] void diverged(const std::string& what, int64_t step, int64_t epoch);
  double sync_seconds() const;  ///< the wrapper's gradient sync so far (0 without one)
  /// What the Reporter's step record takes of the batch just trained: the step, its learning
  /// rate and gradient norm, and its phase times (the meter's from `before` to `after`, and the
  /// sync since `sync_before`).
  StepScalars batch_scalars(const PhaseTimes& before, double sync_before,
                            const PhaseTimes& after) const;
};

}  // namespace ddp

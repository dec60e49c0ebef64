#pragma once
// The training loop for any model, batch type and loss: a TrainingTask (task.h) says how to
// gather a batch by index and what its loss and metric sums are; the Trainer does the rest. Each
// rank trains on its DistributedSampler shard, metrics are reduced over ranks, rank 0 logs in the
// seed scripts' format, and every epoch reports where the time went (data, forward+backward,
// gradient sync, optimizer) without an external profiler. The same Trainer runs a single process
// (world size 1, no DistributedDataParallel).
//
// Two ways to build one:
// - Trainer(group, model, task, optimizer, options, ddp): any task; fit(epochs), train_epoch(e),
//   evaluate(). docs/training_loop.md has an example.
// - Trainer(group, model, forward, optimizer, options, ddp): the classification preset
//   (classification.h), which the examples use; fit(train, test, epochs), train_epoch(train, e),
//   evaluate(test) build a ClassificationTask over the ImageDatasets (and TrainerOptions::augment)
//   and run the same loop.
//
// Optionally it augments each batch, checks that the replicas are still identical every N
// steps, writes a checkpoint at every epoch end (and every N steps) and resumes from one
// (snapshot.h): a resumed run continues exactly where the stopped one was, because everything
// random in an epoch is a function of (seed, epoch, rank) or restored from the snapshot.
//
// A stop signal (SIGTERM, SIGUSR1, SIGUSR2: stop_signal.h) on any rank stops every rank at the
// same step boundary: they agree on it with one small all-reduce every `stop_check_every` steps,
// write a snapshot of where they stand inside the epoch, and fit() returns; stopped_by() says
// why, and a program exits with kStoppedExitCode.

#include <ddp/train/image_dataset.h>
#include <ddp/train/autocast.h>
#include <ddp/train/grad_scaler.h>
#include <ddp/train/lr_schedule.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/progress.h>
#include <ddp/process_group.h>
#include <ddp/runtime.h>
#include <ddp/timeline.h>
#include <ddp/train/classification.h>
#include <ddp/train/snapshot.h>
#include <ddp/train/task.h>
#include <ddp/stop_signal.h>

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

struct CheckpointOptions {
  // Rank 0 writes model_with_epoch<N>.pt (the weights, as the seed does) and
  // snapshot_epoch<N>.pt (the whole training state) here at every epoch end. Empty: none.
  std::string dir;
  int64_t keep = 3;             // newest epochs kept of each kind; 0: keep all
  // "": start fresh; "latest": the newest snapshot in `dir` (fresh start when there is none);
  // otherwise the path of a snapshot.
  std::string resume;
  // With "latest": an unreadable newest snapshot is skipped for the one before it (with a
  // warning) instead of being an error.
  bool fallback = false;
  // Also a snapshot inside the epoch every N optimizer steps (snapshot_epoch<E>_batch<B>.pt),
  // for the crashes that give no warning; only the newest such file is kept. 0: epoch ends only.
  int64_t every_steps = 0;
};

struct TrainerOptions {
  int64_t batch_size = 64;            // per rank
  int64_t test_batch_size = 1000;     // per rank
  int64_t log_interval = 10;          // batches between progress lines (and loss updates); 0: none
  ProgressMode progress = ProgressMode::Auto;  // rank 0's live bar or log lines (progress.h)
  int64_t limit_train_batches = 0;    // per epoch; 0: the whole shard
  bool dry_run = false;               // one batch per epoch
  bool shuffle = true;
  int64_t seed = 0;                   // seeds the sampler's permutation
  std::string metrics_file;           // one JSON object per epoch (rank 0); empty: none
  Timeline* timeline = nullptr;       // records data/forward/backward/optimizer spans when set
  // The classification preset only: applied to training batches before normalisation; empty:
  // none. (A task of one's own augments in Task::prepare.)
  Augment augment;
  // Every N optimizer steps, verify bit for bit that all replicas hold the same parameters and
  // buffers (replica_check.h); a difference stops the job naming the tensor and ranks. 0: never.
  int64_t check_sync_every = 0;
  CheckpointOptions checkpoint;
  // Steps between the checks whether a rank got a stop signal: one all-reduce of 3 doubles on
  // the process group's CPU communicator (docs/reliability.md has its cost). 0: no check, and the
  // signals keep their default action (the process dies).
  int64_t stop_check_every = 1;

  // The training step (docs/training_loop.md has the same pieces in a loop of one's own).
  // Micro-batches per optimizer step: backward runs under DistributedDataParallel::no_sync() on
  // all but the last of each group, and each micro-batch's loss is divided by `accumulate`, so a
  // step sees the mean over batch_size * ranks * accumulate samples. An epoch's last group may be
  // shorter. Stop checks, replica checks and snapshots happen only between groups. 1: a step per
  // batch.
  int64_t accumulate = 1;
  // > 0: the gradients are clipped to this global 2-norm (clip_grad_norm) before every step.
  double clip_grad_norm = 0;
  // The forward and the loss under Autocast on the rank's device: bf16, or fp16 with a
  // GradScaler (options below; its state goes into snapshots). Off: fp32.
  AmpMode amp = AmpMode::Off;
  GradScalerOptions grad_scaler;
  // Stepped after every optimizer step (not per epoch), its position saved in snapshots. Built by
  // the caller on the same optimizer; it must outlive the Trainer. Null: none. fit() refuses a
  // per-epoch scheduler as well.
  LRSchedule* lr_schedule = nullptr;
};

// Wall seconds per phase of the training steps, averaged over ranks.
struct PhaseTimes {
  double data = 0;              // gathering and normalising the batch
  double forward_backward = 0;  // excluding the gradient sync that runs inside backward
  double sync = 0;              // gradient all-reduce
  double optimizer = 0;         // zero_grad + step
};

struct EpochResult {
  int64_t epoch = 0;
  double train_loss = 0;        // mean over every sample trained on, all ranks
  int64_t samples = 0;          // all ranks
  double seconds = 0;           // wall time of the training phase (slowest rank)
  double samples_per_sec = 0;   // samples / seconds
  PhaseTimes phases;
  std::vector<Metric> train_metrics;  // the task's train_metrics(), over all ranks
  // Set when fit() evaluated (the task has a test set):
  std::optional<double> test_loss;
  std::optional<double> test_accuracy;  // fraction 0..1, when the task has an "accuracy" metric
  std::vector<Metric> test_metrics;     // the task's test_metrics(), "accuracy" included
};

struct Evaluation {
  double loss = 0;              // mean loss per sample (classification: negative log-likelihood)
  int64_t correct = 0;          // the "accuracy" metric's sum (correct predictions), else 0
  int64_t total = 0;            // test samples, all ranks
  std::vector<Metric> metrics;  // the task's test_metrics()
  double accuracy() const { return total ? double(correct) / double(total) : 0.0; }
};

class Trainer {
 public:
  // Any task: `task` (which must outlive the Trainer) gathers the batches and computes the loss,
  // running `model` (the module whose parameters `optimizer` steps, and that snapshots save).
  // `ddp` is the wrapper around `model` when training data-parallel, or null for a single
  // process.
  Trainer(ProcessGroup& group, torch::nn::Module& model, TrainingTask& task,
          torch::optim::Optimizer& optimizer, TrainerOptions options,
          DistributedDataParallel* ddp = nullptr);

  // One pass over this rank's shard of the task's training set (collective).
  EpochResult train_epoch(int64_t epoch);
  // Exact evaluation over all of the task's test set: each sample is counted once over all ranks.
  Evaluation evaluate();
  // Epochs 1..epochs (or from the resumed snapshot's next epoch): train, evaluate (when the task
  // has a test set), log, write metrics, scheduler->step() if given, then checkpoint. Rank 0 ends
  // with summary_table() of the epochs it ran. Returns those epochs.
  std::vector<EpochResult> fit(int64_t epochs, torch::optim::LRScheduler* scheduler = nullptr);

  // The classification preset. `forward` maps a batch of normalised inputs to log-probabilities
  // [B, classes]; the methods below train and evaluate a ClassificationTask over the data sets.
  using Forward = ClassificationTask::Forward;
  Trainer(ProcessGroup& group, torch::nn::Module& model, Forward forward,
          torch::optim::Optimizer& optimizer, TrainerOptions options,
          DistributedDataParallel* ddp = nullptr);
  EpochResult train_epoch(const ImageDataset& train, int64_t epoch);
  Evaluation evaluate(const ImageDataset& test);
  std::vector<EpochResult> fit(const ImageDataset& train, const ImageDataset& test,
                               int64_t epochs, torch::optim::LRScheduler* scheduler = nullptr);

  // Optimizer steps taken so far, counting those before a resume.
  int64_t global_step() const { return global_step_; }
  // The fp16 loss scaler (TrainerOptions::amp is Fp16), else null.
  const GradScaler* grad_scaler() const { return scaler_ ? &*scaler_ : nullptr; }

  // The stop signal that ended the last fit() early (stop_signal.h), 0 when it ran to the end;
  // then stop_snapshot() is the snapshot it wrote ("" without a checkpoint directory).
  int stopped_by() const { return stopped_by_; }
  const std::string& stop_snapshot() const { return stop_snapshot_; }

 private:
  // This rank's sums of an epoch in progress, as a snapshot keeps them (RankState::values).
  struct EpochSums {
    double loss = 0, samples = 0, seconds = 0;
    PhaseTimes phases;  // sync: so far
    std::vector<double> metrics;  // the task's train_metrics()
  };
  // Checks the options (both constructors).
  void check_options();
  // The task the generic methods run: the constructor's, or the preset's of the call.
  TrainingTask& task();
  // Throws naming the task's metric when it is not a valid unique name.
  void check_task_metrics();
  void open_metrics(int64_t finished_epochs);
  void write_metrics(const EpochResult& result);
  // Loads the snapshot options_.checkpoint.resume names; returns the first epoch to run.
  int64_t resume(torch::optim::LRScheduler* scheduler);
  void checkpoint(int64_t epoch);
  // At the end of a group of micro-batches: unscale and clip as configured, step (or skip, fp16
  // overflow), update the scaler, step the per-step schedule.
  void optimizer_step();
  // The boundary before batch `b` of an epoch whose first batch this process trains is
  // `first_batch`: the stop check (collective) and the periodic snapshot decide.
  enum class Boundary { Continue, Save, Stop };
  Boundary at_boundary(int64_t b, int64_t first_batch);
  void save_inside_epoch(const std::string& path, int64_t epoch, int64_t b, const EpochSums& sums,
                         at::Generator& augment_generator);
  void report_stop(int64_t epoch, int64_t b);
  // Rank 0, once `newest` is complete: removes the snapshots taken inside an epoch that are
  // older than it (only the newest such is worth keeping).
  void remove_older_inside_epoch_snapshots(const std::string& newest);

  ProcessGroup& group_;
  Runtime& runtime_;
  torch::nn::Module& model_;
  Forward forward_;         // the preset's
  TrainingTask* task_;      // null with the preset, outside its calls
  torch::optim::Optimizer& optimizer_;
  TrainerOptions options_;
  DistributedDataParallel* ddp_;
  std::ofstream metrics_;
  int64_t global_step_ = 0;
  // Installed for the Trainer's lifetime unless stop_check_every is 0.
  std::optional<StopSignalHandlers> stop_handlers_;
  // DDP_TEST_SIGNAL_AT_STEP=STEP:RANK:SIGNAL (tests only): rank RANK raises SIGNAL (TERM, USR1,
  // USR2, KILL for a crash, STOP for a hung rank) on itself right after optimizer step STEP,
  // saying so on stderr first: a signal at a known step, so the tests can assert where the
  // ranks stop.
  int64_t test_signal_step_ = -1;
  int test_signal_rank_ = -1, test_signal_ = 0;
  // A snapshot taken inside epoch resume_epoch_ that fit() continues from.
  int64_t resume_epoch_ = 0, resume_batches_ = 0;
  RankState resume_state_;
  int stopped_by_ = 0;         // the agreed stop: the highest signal number any rank got,
  int stop_rank_ = -1;         // the highest rank that got one,
  double stop_seconds_ = 0;    // and the longest any rank had waited at the check
  std::chrono::steady_clock::time_point stop_checked_at_{};
  std::string stop_snapshot_;
  std::optional<GradScaler> scaler_;  // with AmpMode::Fp16
  TrainingExtras extras() { return TrainingExtras{options_.lr_schedule, scaler_ ? &*scaler_ : nullptr}; }
};

// The end-of-run table, one row per epoch: train loss, test loss and accuracy, training time,
// samples/s over all ranks and the share of the epoch spent in gradient sync, e.g.
//   epoch  train loss  test loss  test acc  time (s)  samples/s    sync
//       1      0.5267     0.3343    87.43%     50.21       1195    4.8%
// The test columns appear when the first epoch has a test loss (accuracy); then a column per
// metric other than accuracy (its mean per sample), headed train_<name> or test_<name>.
std::string summary_table(const std::vector<EpochResult>& epochs);

}  // namespace ddp

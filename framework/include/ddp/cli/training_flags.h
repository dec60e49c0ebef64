#pragma once
/// \file
/// The training flags every ddp::cli program has (--batch-size, --epochs, --lr, --bucket-mb,
/// --checkpoint-dir, --amp, ...; README.md lists them), their checks, and their mapping onto the
/// library's options: DDPOptions, TrainerOptions, the learning-rate schedules, the Timeline.
/// The errors name the flags (`--epochs must be >= 1 (got 0)`): here the flags are the API.

#include <ddp/train/lr_schedule.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/process_group.h>
#include <ddp/runtime.h>
#include <ddp/timeline.h>
#include <ddp/train/trainer.h>

#include <boost/program_options/options_description.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace ddp::cli {

/// Whether the program wraps its model in DistributedDataParallel (make_ddp) or trains in one
/// process (ddp::cli::run refuses several ranks for it).
enum class Parallelism { SingleProcess, DataParallel };

/// The parsed flags, a field per flag (--batch-size: batch_size); --help says what each means.
/// add_training_flags stores into it; the defaults are its own.
struct TrainingFlags {
  ///@{
  /// --batch-size (per rank, >= 1), --test-batch-size (>= 1, default 1000), --epochs (>= 1),
  /// --log-interval (batches between progress lines and step records, default 10; 0: none),
  /// --seed (>= 0, default 1: model init, data order, augmentation).
  int64_t batch_size = 0, test_batch_size = 0, epochs = 0, log_interval = 0, seed = 0;
  ///@}
  ///@{
  /// --limit-train-batches (at most N batches per epoch; 0: all), --check-sync-every (compare
  /// the replicas every N steps; 0: never), --keep-checkpoints (newest N epochs kept, default 3;
  /// 0: all).
  int64_t limit_train_batches = 0, check_sync_every = 0, keep_checkpoints = 0;
  ///@}
  /// --checkpoint-every-steps: also a snapshot every N steps inside an epoch (0: epoch ends only).
  int64_t checkpoint_every_steps = 0;
  ///@{
  /// --lr (finite, > 0), --bucket-mb (gradient bucket cap in MiB, default 25), --first-bucket-mb
  /// (the first bucket's cap in MiB, default 1).
  double lr = 0, bucket_mb = 0, first_bucket_mb = 0;
  ///@}
  ///@{
  /// The switches --save-model, --no-cuda, --dry-run (one batch, one epoch) and --show-topology.
  bool save_model = false, no_cuda = false, dry_run = false, show_topology = false;
  ///@}
  ///@{
  /// The switches --find-unused-parameters, --no-broadcast-buffers and --resume-fallback (with
  /// --resume: skip an unreadable newest snapshot for the previous one).
  bool find_unused_parameters = false, no_broadcast_buffers = false, resume_fallback = false;
  ///@}
  bool keep_global_batch = false;  ///< --keep-global-batch (TrainerOptions::keep_global_batch)
  bool deterministic = false;      ///< --deterministic (use_deterministic_kernels)
  bool gradient_as_bucket_view = false;  ///< --gradient-as-bucket-view (DDPOptions's)
  bool overlap_step = false;             ///< --overlap-step (make_ddp composes hook_then_optimizer)
  ///@{
  /// --data-dir, --metrics-file (JSON lines; empty: none), --timeline (trace file; empty: none),
  /// --backend (auto, mpi or nccl), --checkpoint-dir (empty: no checkpoints), --resume (empty:
  /// a fresh start; "latest" for a bare --resume: the newest snapshot; else a snapshot's path).
  std::string data_dir, metrics_file, timeline, checkpoint_dir, resume;
  std::string backend = "auto";
  ///@}
  std::string tensorboard;  ///< --tensorboard DIR (ReporterOptions::tensorboard_dir)
  /// --progress: bar, log, none or auto (the default).
  std::string progress = "auto";
  ///@{
  /// The training step: --accumulate (micro-batches per optimizer step, >= 1) and --warmup-steps
  /// (linear warmup over N optimizer steps, then the schedule per step; 0: per epoch).
  int64_t accumulate = 1, warmup_steps = 0;
  ///@}
  int64_t scale_lr_with_batch = 0;  ///< --scale-lr-with-batch REFERENCE; 0: off
  /// --clip-grad-norm: the gradients' global 2-norm cap (0: no clipping).
  double clip_grad_norm = 0;
  ///@{
  /// --amp (off, bf16 or fp16; default off) and --schedule (cosine or step).
  std::string amp, schedule;
  ///@}
  std::string on_nonfinite = "stop";  ///< --on-nonfinite: stop or skip (ddp::OnNonFinite)
  /// --max-skipped-steps: with --on-nonfinite skip, stop after N dropped steps in a row (>= 1).
  int64_t max_skipped_steps = 10;
  std::optional<double> timeout;                   ///< --timeout, when given
  std::string hierarchical = "auto";               ///< --hierarchical: auto, on or off
  std::optional<double> checkpoint_every_seconds;  ///< --checkpoint-every-seconds, when given
  /// --comm-hook: allreduce, fp16, bf16 or powersgd (with --powersgd-rank, --powersgd-start-iter).
  std::string comm_hook = "allreduce";
  ///@{
  /// --powersgd-rank (the approximation's rank, >= 1) and --powersgd-start-iter (plain
  /// all-reduce for the first N steps, >= 2).
  int64_t powersgd_rank = 1, powersgd_start_iter = 1000;
  ///@}
};

/// The defaults that differ between programs.
struct TrainingDefaults {
  int64_t batch_size;             ///< --batch-size's default (per rank)
  int64_t epochs;                 ///< --epochs's default
  double lr;                      ///< --lr's default
  std::string data_dir;           ///< --data-dir's default
  std::string data_help;          ///< what --data-dir holds
  std::string model_file;         ///< what --save-model writes
  std::string schedule = "step";  ///< --schedule's default: cosine or step
};

/// Adds --help to `options`, and the training flags in groups by topic (training, data,
/// distributed, checkpoints, progress and diagnostics), storing into `flags`, which must outlive
/// the parsing.
void add_training_flags(boost::program_options::options_description& options, TrainingFlags& flags,
                        const TrainingDefaults& defaults);

/// Throws std::invalid_argument naming the flag when a value is out of range, unknown, or needs a
/// flag that is missing (--resume without --checkpoint-dir), or when flags conflict
/// (--overlap-step with what needs every gradient before the step). ddp::cli::run calls it right
/// after parsing.
void check_training_flags(const TrainingFlags& flags);

/// --deterministic, as torch.use_deterministic_algorithms(True) with cudnn.deterministic: cuDNN's
/// deterministic algorithms without autotuning, ATen's deterministic mode, and
/// CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set (cuBLAS reads it when it starts, so this runs before
/// any CUDA work). ddp::cli::run calls it after parsing.
void use_deterministic_kernels();

/// The ProcessGroupOptions of --timeout and --hierarchical.
ddp::ProcessGroupOptions process_group_options(const TrainingFlags& flags);

/// The RuntimeOptions of --no-cuda and --timeout, which bounds MPI start-up too
/// (RuntimeOptions::startup_timeout; without it DDP_STARTUP_TIMEOUT_SECONDS, else 600 s).
/// ddp::cli::run parses the flags before it makes the Runtime, for this.
ddp::RuntimeOptions runtime_options(const TrainingFlags& flags);

/// Null without --timeline. Collective (on group.cpu()); write it with finish() on every rank.
std::unique_ptr<ddp::Timeline> make_timeline(ddp::ProcessGroup& group, const TrainingFlags& flags);

/// The DistributedDataParallel options of --backend, --bucket-mb, --first-bucket-mb,
/// --find-unused-parameters, --gradient-as-bucket-view and --no-broadcast-buffers.
ddp::DDPOptions ddp_options(const TrainingFlags& flags, ddp::Timeline* timeline);

/// The wrapper those options describe, with the hook of --comm-hook registered (fp16, bf16,
/// powersgd; allreduce is the default) and, with --overlap-step, composed with the step of
/// `optimizer` (hook_then_optimizer: the program's optimizer must update each parameter from its
/// own gradient and state, as SGD, Adam and ddp::Adadelta do); null for a SingleProcess program.
/// Collective.
std::unique_ptr<ddp::DistributedDataParallel> make_ddp(
    ddp::ProcessGroup& group, std::shared_ptr<torch::nn::Module> model, const TrainingFlags& flags,
    Parallelism parallelism, ddp::Timeline* timeline, torch::optim::Optimizer& optimizer);

/// The TrainerOptions the flags describe (every field a flag sets: the one place to map a new
/// one). Checks the flags first, so an error names the flag rather than the option.
ddp::TrainerOptions trainer_options(const TrainingFlags& flags, ddp::Timeline* timeline);

/// The learning-rate schedule of --schedule: per epoch without --warmup-steps, as the PyTorch
/// examples do; per optimizer step with it (a linear warmup, then the decay counted in steps, as
/// the Trainer counts them). Exactly one of the two is set.
struct Schedules {
  std::unique_ptr<torch::optim::LRScheduler> per_epoch;  ///< for Trainer::fit
  std::unique_ptr<ddp::LRSchedule> per_step;             ///< for TrainerOptions::lr_schedule
};
/// The Schedules of the flags, for flags check_training_flags accepted, on `optimizer` (whose rates
/// --scale-lr-with-batch scales first, so either schedule takes the scaled rate as its base);
/// `step_size` (epochs) and `gamma` are the step decay's.
Schedules make_schedules(const TrainingFlags& flags, torch::optim::Optimizer& optimizer,
                         int64_t train_size, int world_size, int64_t step_size, double gamma);

}  // namespace ddp::cli

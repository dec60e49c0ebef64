#include <ddp/train/trainer.h>

#include <ddp/config.h>
#include <ddp/train/augment.h>
#include <ddp/train/grad_clip.h>
#include <ddp/train/replica_check.h>

#include "util/clock.h"
#include "util/testing_hooks.h"
#if DDP_WITH_CUDA
#include "util/cuda_device.h"
#endif

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ddp {

namespace {

void at_least(const char* option, int64_t value, int64_t least) {
  if (value >= least) return;
  throw std::invalid_argument("TrainerOptions::" + std::string(option) + " must be >= " +
                              std::to_string(least) + " (got " + std::to_string(value) + ")");
}

// Checks the options that are the Trainer's own (the parts check theirs), before any part is
// built.
TrainerOptions checked(TrainerOptions options, const ProcessGroup& group,
                       const DistributedDataParallel* ddp) {
  at_least("batch_size", options.batch_size, 1);
  at_least("test_batch_size", options.test_batch_size, 1);
  at_least("limit_train_batches", options.limit_train_batches, 0);
  at_least("check_sync_every", options.check_sync_every, 0);
  at_least("stop_check_every", options.stop_check_every, 0);
  at_least("accumulate", options.accumulate, 1);
  at_least("max_skipped_steps", options.max_skipped_steps, 1);
  if (!(options.clip_grad_norm >= 0) || !std::isfinite(options.clip_grad_norm)) {
    throw std::invalid_argument("TrainerOptions::clip_grad_norm must be finite and >= 0 (got " +
                                std::to_string(options.clip_grad_norm) + ")");
  }
  if (!ddp && group.size() > 1) {
    throw std::invalid_argument("Trainer: " + std::to_string(group.size()) +
                                " ranks but no DistributedDataParallel: the replicas would "
                                "diverge (wrap the model, or run one process)");
  }
  options.checkpoint.seed = options.seed;
  options.checkpoint.batch_size = options.batch_size;
  // What else shapes the trajectory: named at a resume that changes it (Checkpointer::resume).
  std::ostringstream clip;
  clip << options.clip_grad_norm;
  options.checkpoint.settings.insert(
      options.checkpoint.settings.begin(),
      {{"gradient accumulation (micro-batches per step)", std::to_string(options.accumulate)},
       {"mixed precision", amp_mode_name(options.amp)},
       {"gradient clipping (global norm, 0: off)", clip.str()}});
  return options;
}

bool valid_metric_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// Throws naming the task's metric when it is not a valid unique name.
void check_metric_names(const TrainingTask& task) {
  for (const auto& [kind, names] : {std::make_pair("train_metrics", task.train_metrics()),
                                    std::make_pair("test_metrics", task.test_metrics())}) {
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      if (!valid_metric_name(name) ||
          std::find(names.begin(), names.begin() + i, name) != names.begin() + i) {
        throw std::invalid_argument(
            "Trainer: the task's " + std::string(kind) + "() has \"" + name +
            "\": a metric name must be unique and made of lower case letters, digits and '_'");
      }
    }
  }
}

// The most GPU memory tensors held at once on any rank since the epoch's start, in MiB; -1 when
// every rank trains on the CPU. Collective.
double largest_gpu_memory_peak_mb(ProcessGroup& group) {
  double mib = -1;
#if DDP_WITH_CUDA
  if (group.device().is_cuda()) {
    mib = static_cast<double>(detail::cuda_memory_peak_bytes(group.device().index())) /
          (1024.0 * 1024.0);
  }
#endif
  torch::Tensor largest = torch::tensor({mib}, torch::kDouble);
  group.cpu().all_reduce(largest, ReduceOp::Max);
  return largest.item<double>();
}

// The epoch's metrics-file line (rank 0), after its snapshot in `dir` (none when empty) was
// written: a failed write throws naming the file, the reason and that snapshot.
void write_metrics_after_save(Reporter& reporter, const EpochResult& r, const std::string& dir,
                              int64_t epoch) {
  try {
    reporter.write_metrics(r);
  } catch (const std::runtime_error& e) {
    if (dir.empty()) throw;
    throw std::runtime_error(std::string(e.what()) + " (after epoch " + std::to_string(epoch) +
                             "'s snapshot " + snapshot_path(dir, epoch) +
                             " was written: resuming from it loses only this epoch's line)");
  }
}

}  // namespace

GlobalBatchNotDivisible::GlobalBatchNotDivisible(int64_t snapshot_batch_size, int snapshot_ranks,
                                                 int ranks)
    : std::invalid_argument(
          "TrainerOptions::keep_global_batch: the snapshot's global batch of " +
          std::to_string(snapshot_batch_size * snapshot_ranks) + " samples (" +
          std::to_string(snapshot_batch_size) + " per rank x " + std::to_string(snapshot_ranks) +
          " ranks) does not divide among this run's " + std::to_string(ranks) +
          " ranks: run on a number of ranks that divides it, or resume without keep_global_batch "
          "(batch_size per rank)"),
      snapshot_batch_size_(snapshot_batch_size),
      snapshot_ranks_(snapshot_ranks),
      ranks_(ranks) {}

Trainer::Trainer(ProcessGroup& group, torch::nn::Module& model, TrainingTask& task,
                 torch::optim::Optimizer& optimizer, TrainerOptions options,
                 DistributedDataParallel* ddp)
    : group_(group),
      model_(model),
      task_(task),
      optimizer_(optimizer),
      options_(checked(std::move(options), group, ddp)),
      ddp_(ddp),
      scaler_(options_.amp == AmpMode::Fp16
                  ? std::optional<GradScaler>(std::in_place, &group.cpu(), options_.grad_scaler)
                  : std::nullopt),
      boundary_(group,
                Checkpointer(group, model, optimizer, options_.checkpoint,
                             TrainingExtras{options_.lr_schedule, scaler_ ? &*scaler_ : nullptr}),
                options_.stop_check_every),
      reporter_(group, options_.report),
      source_(task.train_source_any()),
      sampler_(std::max<int64_t>(task.train_size(), 0), group.size(), group.rank(),
               options_.shuffle, options_.seed) {
  check_metric_names(task);
  backward_steps_ = ddp_ && ddp_->backward_steps_optimizer();
  if (!backward_steps_) return;
  if (ddp_->backward_steps_optimizer() != &optimizer_) {
    throw std::invalid_argument(
        "Trainer: the wrapper's comm hook steps another optimizer than the "
        "Trainer's: compose hook_then_optimizer() with this optimizer");
  }
  const char* needs_every_gradient = options_.clip_grad_norm > 0 ? "clip_grad_norm"
                                     : scaler_ ? "amp Fp16 (the GradScaler's unscale and inf check)"
                                     : options_.on_nonfinite == OnNonFinite::Skip
                                         ? "on_nonfinite Skip"
                                         : nullptr;
  if (needs_every_gradient) {
    throw std::invalid_argument(std::string("TrainerOptions::") + needs_every_gradient +
                                " needs every gradient before the optimizer step, but backward "
                                "steps it bucket by bucket (the comm hook hook_then_optimizer): "
                                "register the inner hook alone, or drop the option");
  }
}

Trainer::~Trainer() = default;

int64_t Trainer::batches_per_epoch() const {
  // Every rank has the same shard size, so every rank runs the same number of steps.
  return epoch_.batches(sampler_, options_.batch_size);
}

int64_t Trainer::batches_to_train() const {
  return epoch_length(batches_per_epoch(), options_.dry_run ? 1 : options_.limit_train_batches)
      .batches;
}

double Trainer::sync_seconds() const { return ddp_ ? ddp_->sync_seconds() : 0.0; }

std::vector<EpochResult> Trainer::fit(int64_t epochs, torch::optim::LRScheduler* scheduler) {
  // An empty set would train nothing and report "0/0 (0%)" as if all were well.
  if (task_.train_size() <= 0)
    throw std::invalid_argument("Trainer::fit: the training set is empty");
  if (scheduler && options_.lr_schedule) {
    throw std::invalid_argument(
        "Trainer::fit: a per-epoch scheduler and TrainerOptions::lr_schedule "
        "would both set the learning rate; use one");
  }
  stop_snapshot_.clear();
  const auto started = Clock::now();
  const ResumePoint& start = boundary_.resume(scheduler);
  global_step_ = start.position.step;
  if (options_.keep_global_batch && start.resumed()) keep_global_batch();
  if (start.seed != options_.seed) {
    // The snapshot's data order continues (the Checkpointer warned).
    options_.seed = start.seed;
    sampler_ = DistributedSampler(task_.train_size(), group_.size(), group_.rank(),
                                  options_.shuffle, options_.seed);
  }
  reporter_.start_run(start);
  std::vector<EpochResult> results;
  int64_t last_epoch = epochs;  // a dry run's is its first
  for (int64_t epoch = start.position.epoch; epoch <= epochs; ++epoch) {
    EpochResult r = train_epoch(epoch);
    if (stopped_by()) break;
    // The epoch's loss is agreed (reduced over ranks): before evaluation and its snapshot.
    if (!std::isfinite(r.train_loss)) {
      diverged("the epoch's training loss over all ranks is " +
                   std::string(std::isnan(r.train_loss) ? "nan" : "inf"),
               global_step_, epoch);
    }
    // An update of finite gradients can still overflow (a huge rate): the next step's gradients
    // would say so, but the epoch ends here. One read of the model per epoch.
    const std::string tensor = first_nonfinite_tensor(model_);
    if (!tensor.empty()) {
      diverged("the model's " + tensor +
                   " is not finite after the epoch's last update (its "
                   "gradients were finite: the update overflowed)",
               global_step_, epoch);
    }
    if (task_.test_size() > 0) {
      const Evaluation eval = evaluate();
      r.test_loss = eval.loss;
      r.test_metrics = eval.metrics;
    }
    reporter_.print_epoch(r);
    results.push_back(r);
    if (scheduler) scheduler->step();
    // The checkpoint before the metrics line: a failed metrics write ends the job with the epoch
    // saved.
    boundary_.checkpointer().save_epoch(epoch, global_step_);
    write_metrics_after_save(reporter_, r, options_.checkpoint.dir, epoch);
    if (options_.dry_run) {
      last_epoch = epoch;
      break;
    }
  }
  reporter_.end_run(results, boundary_.checkpointer().cost(), seconds_since(started));
  if (!stopped_by()) boundary_.end_run(last_epoch);
  return results;
}

void Trainer::keep_global_batch() {
  const int ranks = group_.size();
  const ResumePoint& start = boundary_.resumed();
  if (start.batch_size <= 0) {
    throw std::runtime_error("TrainerOptions::keep_global_batch: " + start.path +
                             " does not record its batch size (written by an older ddp): resume "
                             "without keep_global_batch");
  }
  const int64_t global = start.batch_size * start.world_size;
  if (global % ranks != 0) throw GlobalBatchNotDivisible(start.batch_size, start.world_size, ranks);
  const int64_t batch_size = global / ranks;
  if (batch_size != options_.batch_size && group_.is_main()) {
    std::printf(
        "Keeping the snapshot's global batch of %lld (%lld per rank x %d ranks): %lld per "
        "rank on %d ranks (TrainerOptions::keep_global_batch)\n",
        static_cast<long long>(global), static_cast<long long>(start.batch_size), start.world_size,
        static_cast<long long>(batch_size), ranks);
    std::fflush(stdout);
  }
  options_.batch_size = batch_size;
  boundary_.checkpointer().set_batch_size(batch_size);
}

EpochResult Trainer::train_epoch(int64_t epoch) {
  model_.train();
  epoch_ = boundary_.start_epoch(epoch, sampler_, options_.batch_size);
#if DDP_WITH_CUDA
  if (group_.device().is_cuda()) detail::reset_cuda_memory_peak(group_.device().index());
#endif
  const int64_t batches = batches_to_train();
  EpochMeter meter(task_.train_metrics(), group_.device());
  at::Generator generator =
      augmentation_generator(static_cast<uint64_t>(options_.seed), group_.rank(), epoch);
  const int64_t first = restore_epoch(generator, meter);
  const double sync_at_start = sync_seconds();
  // The source counts the sampler's batches.
  source_->start(sampler_, options_.batch_size, epoch_.sampler_batch(first),
                 epoch_.sampler_batch(batches), group_.device());
  reporter_.start_epoch(EpochPlan{epoch, first, batches, batches_per_epoch(), options_.batch_size,
                                  task_.train_size(), epoch_.sampler_offset, epoch_.sampler_start});
  const auto& trained_samples = testing::hooks().trained_samples;
  const std::vector<int64_t> order = trained_samples ? sampler_.indices() : std::vector<int64_t>();
  for (int64_t b = first; b < batches; ++b) {
    // With accumulation, an optimizer step is a group of `accumulate` micro-batches; the
    // boundaries (stop check, snapshots, replica check) lie only between groups, where no
    // gradient is half accumulated.
    if (b % options_.accumulate == 0 && stop_at(b, generator, meter, sync_at_start)) {
      return EpochResult{};
    }
    const int64_t step_of_batch = global_step_ + 1;  // taken at the end of the batch's group
    const PhaseTimes before = meter.phases();
    const double sync_before = sync_seconds();
    const StepOutput out = step(epoch, b, batches, generator, meter);
    if (trained_samples) {
      trained_samples(epoch, step_of_batch, group_.rank(), group_.size(),
                      detail::index_slice(order, epoch_.sampler_batch(b) * options_.batch_size,
                                          options_.batch_size));
    }
    reporter_.batch_done(b, out.loss, out.samples,
                         batch_scalars(before, sync_before, meter.phases()));
  }
  try {
    boundary_.end_epoch(nonfinite_loss_step_);
  } catch (const TrainingDiverged& e) {
    diverged(e.what(), e.step(), e.epoch());
  }
  reporter_.end_epoch();
  EpochResult result = meter.reduce(group_.cpu(), epoch, sync_seconds() - sync_at_start);
  result.gpu_memory_peak_mb = largest_gpu_memory_peak_mb(group_);
  return result;
}

StepScalars Trainer::batch_scalars(const PhaseTimes& before, double sync_before,
                                   const PhaseTimes& after) const {
  StepScalars scalars;
  scalars.step = global_step_;
  scalars.lr = step_lr_;
  scalars.grad_norm = step_grad_norm_;
  // The batch's phases as the epoch counts them: the sync, timed inside backward, moved out of
  // forward_backward into its own phase (EpochMeter::reduce does the same for the epoch).
  const double sync = sync_seconds() - sync_before;
  scalars.phases =
      PhaseTimes{after.data - before.data, after.forward_backward - before.forward_backward - sync,
                 sync, after.optimizer - before.optimizer};
  return scalars;
}

int64_t Trainer::restore_epoch(at::Generator& generator, EpochMeter& meter) {
  if (epoch_.first_batch == 0) return 0;
  // Inside the epoch a snapshot resumes: its batches done, this rank's generator and its sums.
  const RankState& state = epoch_.rank_state;
  if (state.generator.defined()) generator.set_state(state.generator);
  if (state.values.defined()) {
    try {
      meter.restore(state.values);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("Trainer: rank " + std::to_string(group_.rank()) + ": " + e.what());
    }
  }
  return std::min(epoch_.first_batch, batches_to_train());
}

bool Trainer::stop_at(int64_t b, at::Generator& generator, const EpochMeter& meter,
                      double sync_at_start) {
  bool stopping = false;
  try {
    // Only here (a snapshot) does the step read this epoch's sums from the device.
    stopping = boundary_.at_step(
        b, global_step_,
        [&] {
          return RankState{generator.get_state(), meter.state(sync_seconds() - sync_at_start)};
        },
        nonfinite_loss_step_);
  } catch (const TrainingDiverged& e) {  // a loss that was not finite, agreed
    diverged(e.what(), e.step(), e.epoch());
  }
  if (!stopping) return false;
  stop_snapshot_ = boundary_.snapshot();
  reporter_.stopped(boundary_.stop(), boundary_.position(), stop_snapshot_);
  return true;
}

}  // namespace ddp

#include <ddp/train/trainer.h>

#include <ddp/train/augment.h>
#include <ddp/train/grad_clip.h>
#include <ddp/checkpoint_file.h>
#include <ddp/distributed_sampler.h>
#include <ddp/train/replica_check.h>
#include <ddp/train/snapshot.h>

#include "util/clock.h"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <any>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace ddp {

namespace {


std::string percent(double part, double whole) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return text;
}

// DDP_TEST_SIGNAL_AT_STEP=STEP:RANK:SIGNAL, e.g. 5:1:TERM.
void parse_test_signal(const char* text, int64_t& step, int& rank, int& signal) {
  const std::string value = text;
  const auto bad = [&] {
    return std::invalid_argument("DDP_TEST_SIGNAL_AT_STEP='" + value +
                                 "': expected STEP:RANK:SIGNAL, e.g. 5:1:TERM (SIGNAL: TERM, "
                                 "USR1, USR2, KILL or STOP)");
  };
  const size_t a = value.find(':'), b = value.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) throw bad();
  try {
    step = std::stoll(value.substr(0, a));
    rank = std::stoi(value.substr(a + 1, b - a - 1));
  } catch (const std::exception&) {
    throw bad();
  }
  const std::string name = value.substr(b + 1);
  // KILL: a crash with no warning, for the periodic snapshots.
  signal = name == "TERM"   ? SIGTERM
           : name == "USR1" ? SIGUSR1
           : name == "USR2" ? SIGUSR2
           : name == "KILL" ? SIGKILL
           : name == "STOP" ? SIGSTOP  // a hung rank, for the watchdog
                            : 0;
  if (signal == 0 || step < 1 || rank < 0) throw bad();
}

}  // namespace

Trainer::Trainer(ProcessGroup& group, torch::nn::Module& model, TrainingTask& task,
                 torch::optim::Optimizer& optimizer, TrainerOptions options,
                 DistributedDataParallel* ddp)
    : group_(group),
      runtime_(group.runtime()),
      model_(model),
      task_(&task),
      optimizer_(optimizer),
      options_(std::move(options)),
      ddp_(ddp) {
  check_options();
  check_task_metrics();
}

Trainer::Trainer(ProcessGroup& group, torch::nn::Module& model, Forward forward,
                 torch::optim::Optimizer& optimizer, TrainerOptions options,
                 DistributedDataParallel* ddp)
    : group_(group),
      runtime_(group.runtime()),
      model_(model),
      forward_(std::move(forward)),
      task_(nullptr),
      optimizer_(optimizer),
      options_(std::move(options)),
      ddp_(ddp) {
  if (!forward_) throw std::invalid_argument("Trainer: the forward function is empty");
  check_options();
}

namespace {

// The preset's task for the length of one call.
class PresetScope {
 public:
  PresetScope(TrainingTask*& slot, TrainingTask& task) : slot_(slot) { slot_ = &task; }
  ~PresetScope() { slot_ = nullptr; }
  PresetScope(const PresetScope&) = delete;
  PresetScope& operator=(const PresetScope&) = delete;

 private:
  TrainingTask*& slot_;
};

bool valid_metric_name(const std::string& name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// Adds a step's metric sums to the running ones (float64, on the sums' device), checking that
// the task returned one per name.
void add_sums(std::vector<torch::Tensor>& totals, const std::vector<torch::Tensor>& sums,
              const char* method, const char* names) {
  if (sums.size() != totals.size()) {
    throw std::runtime_error("Trainer: the task's " + std::string(method) + " returned " +
                             std::to_string(sums.size()) + " metric sum(s) for the " +
                             std::to_string(totals.size()) + " name(s) of its " + names + "()");
  }
  for (size_t i = 0; i < sums.size(); ++i) {
    if (!sums[i].defined() || sums[i].numel() != 1) {
      throw std::runtime_error("Trainer: the task's " + std::string(method) + " returned metric sum " +
                               std::to_string(i) + " that is not a scalar tensor");
    }
    totals[i] += sums[i].detach().to(totals[i].device(), torch::kDouble).reshape({});
  }
}

}  // namespace

TrainingTask& Trainer::task() {
  if (!task_) {
    throw std::logic_error("Trainer: built with a forward function (the classification preset): "
                           "call fit(train, test, ...), train_epoch(train, ...) or evaluate(test)");
  }
  return *task_;
}

void Trainer::check_task_metrics() {
  for (const auto& [kind, names] : {std::make_pair("train_metrics", task().train_metrics()),
                                    std::make_pair("test_metrics", task().test_metrics())}) {
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      if (!valid_metric_name(name) || std::find(names.begin(), names.begin() + i, name) !=
                                          names.begin() + i) {
        throw std::invalid_argument(
            "Trainer: the task's " + std::string(kind) + "() has \"" + name +
            "\": a metric name must be unique and made of lower case letters, digits and '_'");
      }
    }
  }
}

EpochResult Trainer::train_epoch(const ImageDataset& train, int64_t epoch) {
  if (!forward_) throw std::logic_error("Trainer::train_epoch(train, epoch): this Trainer was built with a task; call train_epoch(epoch)");
  ClassificationTask preset(train, nullptr, forward_, options_.augment);
  PresetScope scope(task_, preset);
  return train_epoch(epoch);
}

Evaluation Trainer::evaluate(const ImageDataset& test) {
  if (!forward_) throw std::logic_error("Trainer::evaluate(test): this Trainer was built with a task; call evaluate()");
  ClassificationTask preset(test, &test, forward_, options_.augment);
  PresetScope scope(task_, preset);
  return evaluate();
}

std::vector<EpochResult> Trainer::fit(const ImageDataset& train, const ImageDataset& test,
                                      int64_t epochs, torch::optim::LRScheduler* scheduler) {
  if (!forward_) throw std::logic_error("Trainer::fit(train, test, ...): this Trainer was built with a task; call fit(epochs)");
  // An empty set would train nothing and report "0/0 (0%)" as if all were well.
  if (train.size() == 0) throw std::invalid_argument("Trainer::fit: the training set is empty");
  if (test.size() == 0) throw std::invalid_argument("Trainer::fit: the test set is empty");
  ClassificationTask preset(train, &test, forward_, options_.augment);
  PresetScope scope(task_, preset);
  return fit(epochs, scheduler);
}

void Trainer::check_options() {
  auto at_least = [](const char* option, int64_t value, int64_t least) {
    if (value >= least) return;
    throw std::invalid_argument("TrainerOptions::" + std::string(option) + " must be >= " +
                                std::to_string(least) + " (got " + std::to_string(value) + ")");
  };
  at_least("batch_size", options_.batch_size, 1);
  at_least("test_batch_size", options_.test_batch_size, 1);
  at_least("log_interval", options_.log_interval, 0);
  at_least("limit_train_batches", options_.limit_train_batches, 0);
  at_least("check_sync_every", options_.check_sync_every, 0);
  at_least("checkpoint.keep", options_.checkpoint.keep, 0);
  at_least("checkpoint.every_steps", options_.checkpoint.every_steps, 0);
  at_least("stop_check_every", options_.stop_check_every, 0);
  at_least("accumulate", options_.accumulate, 1);
  if (!(options_.clip_grad_norm >= 0) || !std::isfinite(options_.clip_grad_norm)) {
    throw std::invalid_argument("TrainerOptions::clip_grad_norm must be finite and >= 0 (got " +
                                std::to_string(options_.clip_grad_norm) + ")");
  }
  if (options_.amp == AmpMode::Fp16) scaler_.emplace(&group_.cpu(), options_.grad_scaler);
  if (options_.checkpoint.every_steps > 0 && options_.checkpoint.dir.empty()) {
    throw std::invalid_argument("TrainerOptions::checkpoint.every_steps is " +
                                std::to_string(options_.checkpoint.every_steps) +
                                " but checkpoint.dir is empty: there is nowhere to write");
  }
  if (options_.checkpoint.resume == "latest" && options_.checkpoint.dir.empty()) {
    throw std::invalid_argument(
        "TrainerOptions::checkpoint.resume is \"latest\" but checkpoint.dir is empty: there is "
        "no directory to search");
  }
  if (!ddp_ && group_.size() > 1) {
    throw std::invalid_argument("Trainer: " + std::to_string(group_.size()) +
                                " ranks but no DistributedDataParallel: the replicas would "
                                "diverge (wrap the model, or run one process)");
  }
  if (group_.is_main() && !options_.checkpoint.dir.empty()) {
    // Now, not after the first epoch: an unwritable directory would waste the epoch.
    try {
      check_writable_directory(options_.checkpoint.dir, "checkpoint directory");
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("TrainerOptions::checkpoint.dir: " + std::string(e.what()));
    }
    // Temporary files of runs killed mid-write (never those of a live writer).
    for (const std::string& path : remove_stale_temporaries(options_.checkpoint.dir)) {
      std::printf("Removed %s, left by an interrupted write of an earlier run\n", path.c_str());
    }
    std::fflush(stdout);
  }
  if (options_.stop_check_every > 0) stop_handlers_.emplace();
  if (const char* hook = std::getenv("DDP_TEST_SIGNAL_AT_STEP"); hook && *hook) {
    parse_test_signal(hook, test_signal_step_, test_signal_rank_, test_signal_);
  }
}

EpochResult Trainer::train_epoch(int64_t epoch) {
  TrainingTask& task = this->task();
  Communicator& comm = group_.cpu();
  const torch::Device device = group_.device();
  model_.train();
  const size_t metric_count = task.train_metrics().size();

  DistributedSampler sampler(task.train_size(), group_.size(), group_.rank(),
                             options_.shuffle, options_.seed);
  sampler.set_epoch(epoch);
  const std::vector<int64_t> indices = sampler.indices();
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t batch_size = options_.batch_size;
  // Every rank has the same shard size, so every rank runs the same number of steps.
  const int64_t batches_per_epoch = (n + batch_size - 1) / batch_size;
  int64_t batches = batches_per_epoch;
  if (options_.limit_train_batches > 0) batches = std::min(batches, options_.limit_train_batches);
  if (options_.dry_run) batches = std::min<int64_t>(batches, 1);

  at::Generator augment_generator =
      augmentation_generator(static_cast<uint64_t>(options_.seed), group_.rank(), epoch);
  // Inside an epoch that a snapshot resumes: its batches done, this rank's augmentation
  // generator and its sums so far.
  int64_t first_batch = 0;
  EpochSums restored;
  if (epoch == resume_epoch_ && resume_batches_ > 0) {
    first_batch = std::min(resume_batches_, batches);
    if (resume_state_.generator.defined()) augment_generator.set_state(resume_state_.generator);
    // 7 numbers, then the task's metric sums: another count is another task's snapshot, whose
    // sums would be wrong here.
    const int64_t expected = static_cast<int64_t>(7 + metric_count);
    if (resume_state_.values.defined() && resume_state_.values.numel() != expected) {
      throw std::runtime_error(
          "Trainer: the snapshot's epoch in progress has " +
          std::to_string(resume_state_.values.numel()) + " sums on rank " +
          std::to_string(group_.rank()) + ", but this task's needs " + std::to_string(expected) +
          " (7 and one per name of train_metrics()): was it written by another task?");
    }
    if (resume_state_.values.defined()) {
      const auto v = resume_state_.values.accessor<double, 1>();
      restored = EpochSums{v[0], v[1], v[2], PhaseTimes{v[3], v[4], v[5], v[6]}, {}};
      for (size_t i = 0; i < metric_count; ++i) restored.metrics.push_back(v[7 + i]);
    }
    resume_batches_ = 0;
    resume_state_ = RankState{};
  }
  PhaseTimes local = restored.phases;
  const double sync_at_start = (ddp_ ? ddp_->sync_seconds() : 0.0) - restored.phases.sync;
  // Loss stays on the device until logged: no host synchronisation per step.
  torch::Tensor loss_sum =
      torch::full({}, restored.loss, torch::TensorOptions().dtype(torch::kDouble).device(device));
  int64_t samples = static_cast<int64_t>(restored.samples);
  // The task's metric sums, as the loss: on the device, read at the epoch end (or a snapshot).
  std::vector<torch::Tensor> metric_sums;
  for (size_t i = 0; i < metric_count; ++i) {
    metric_sums.push_back(torch::full(
        {}, i < restored.metrics.size() ? restored.metrics[i] : 0.0,
        torch::TensorOptions().dtype(torch::kDouble).device(device)));
  }
  const auto epoch_start = Clock::now();
  // Rank 0 reports progress; every rank takes part in the log interval's loss average.
  const ProgressMode progress =
      group_.is_main() ? resolve_progress_mode(options_.progress) : ProgressMode::None;
  double shown_loss = -1;  // the latest loss averaged over ranks; -1 before the first
  Clock::time_point drawn{};
  bool bar_drawn = false;

  Timeline* timeline = options_.timeline;
  // Times one phase into `total` and, when recording, into the timeline.
  auto phase = [&](const char* name, double& total, auto&& body) {
    const auto start = Clock::now();
    body();
    const auto end = Clock::now();
    total += std::chrono::duration<double>(end - start).count();
    if (timeline) timeline->span(name, "step", start, end);
  };
  // What a snapshot at a step boundary keeps of this epoch.
  auto sums_so_far = [&] {
    EpochSums sums;
    sums.loss = loss_sum.item<double>();
    sums.samples = static_cast<double>(samples);
    sums.seconds = restored.seconds + seconds_since(epoch_start);
    sums.phases = local;
    sums.phases.sync = (ddp_ ? ddp_->sync_seconds() : 0.0) - sync_at_start;
    for (const torch::Tensor& m : metric_sums) sums.metrics.push_back(m.item<double>());
    return sums;
  };

  auto gather = [&](int64_t b) {
    const auto first = indices.begin() + b * batch_size;
    return task.train_batch_any(
        std::vector<int64_t>(first, indices.begin() + std::min(n, (b + 1) * batch_size)), device);
  };
  // Batch b+1 is gathered one step ahead, once step b's backward is queued (see below).
  std::any next;
  const int64_t accumulate = options_.accumulate;
  for (int64_t b = first_batch; b < batches; ++b) {
    // With accumulation, an optimizer step is a group of `accumulate` micro-batches; the
    // boundaries (stop check, snapshots, replica check) lie only between groups, where no
    // gradient is half accumulated.
    const bool group_start = b % accumulate == 0;
    const bool group_end = (b + 1) % accumulate == 0 || b + 1 == batches;
    const Boundary action = group_start ? at_boundary(b, first_batch) : Boundary::Continue;
    if (action != Boundary::Continue) {
      // Only here does the step read this epoch's sums from the device.
      const std::string path = options_.checkpoint.dir.empty()
                                   ? std::string()
                                   : snapshot_path(options_.checkpoint.dir, epoch, b);
      if (!path.empty()) save_inside_epoch(path, epoch, b, sums_so_far(), augment_generator);
      if (action == Boundary::Stop) {
        if (bar_drawn) std::printf("\n");
        stop_snapshot_ = path;
        report_stop(epoch, b);
        return EpochResult{};
      }
    }
    std::any batch;
    StepOutput out;
    phase("data", local.data, [&] {
      batch = b == first_batch ? gather(b) : std::move(next);
      task.prepare_any(batch, augment_generator);
    });
    if (group_start) phase("zero_grad", local.optimizer, [&] { optimizer_.zero_grad(); });
    // The buffer broadcast belongs to forward, as in PyTorch's DDP.
    if (ddp_) phase("forward", local.forward_backward, [&] { ddp_->prepare_forward(); });
    if (group_start && options_.check_sync_every > 0 &&
        global_step_ % options_.check_sync_every == 0) {
      // Here, after the buffer broadcast and before forward, healthy replicas are identical.
      // A diagnostic: its time counts in no phase.
      check_replicas_in_sync(model_, comm, "at step " + std::to_string(global_step_) +
                                               " (epoch " + std::to_string(epoch) + ")");
    }
    phase("forward", local.forward_backward, [&] {
      std::optional<Autocast> autocast;
      if (options_.amp != AmpMode::Off) {
        autocast.emplace(device.type(), options_.amp == AmpMode::Fp16 ? torch::kHalf : torch::kBFloat16);
      }
      out = task.loss_any(batch);
    });
    if (!out.loss.defined() || out.loss.numel() != 1) {
      throw std::runtime_error("Trainer: the task's loss() returned " +
                               std::string(out.loss.defined() ? "a loss of " + std::to_string(out.loss.numel()) + " elements"
                                                              : "no loss") +
                               " (step " + std::to_string(global_step_) + "); it must be the batch's mean, a scalar");
    }
    const torch::Tensor loss = out.loss.reshape({});
    phase("backward", local.forward_backward, [&] {
      // Not the last micro-batch of a group: accumulate locally, no communication.
      std::optional<DistributedDataParallel::NoSync> no_sync;
      if (ddp_ && !group_end) no_sync.emplace(*ddp_);
      torch::Tensor scaled = accumulate > 1 ? loss / static_cast<double>(accumulate) : loss;
      if (scaler_) scaled = scaler_->scale(scaled);
      scaled.backward();
    });
    // On a GPU, backward has mostly only been queued here: the host gathers the next batch while
    // the GPU computes, and a copy from host memory (ImageDataset::gather) runs on a side stream
    // during this step's backward and optimizer kernels. Only the gather moves: augmentation and
    // normalisation stay in their step, so the generator's draws keep their order and training
    // is bit-identical to gathering at the start of each step.
    if (b + 1 < batches) phase("data", local.data, [&] { next = gather(b + 1); });
    if (group_end) {
      phase("optimizer", local.optimizer, [&] { optimizer_step(); });
      ++global_step_;
      if (global_step_ == test_signal_step_ && group_.rank() == test_signal_rank_) {
        // Said first, so a test can time the job's end from the signal.
        std::fprintf(stderr, "DDP_TEST_SIGNAL_AT_STEP: rank %d raises signal %d after step %lld\n",
                     group_.rank(), test_signal_, static_cast<long long>(global_step_));
        std::fflush(stderr);
        std::raise(test_signal_);
      }
    }

    loss_sum += loss.detach().to(torch::kDouble) * static_cast<double>(out.samples);
    samples += out.samples;
    add_sums(metric_sums, out.sums, "loss()", "train_metrics");

    if (options_.log_interval > 0 && b % options_.log_interval == 0) {
      torch::Tensor mean_loss = loss.detach().to(torch::kCPU, torch::kDouble).reshape({1});
      comm.all_reduce(mean_loss, ReduceOp::Avg);
      shown_loss = mean_loss.item<double>();
      if (progress == ProgressMode::Log) {
        const int64_t seen = b * batch_size * group_.size();
        std::printf("Train Epoch: %lld [%lld/%lld (%.0f%%)]\tLoss: %.6f\tETA %s\n",
                    static_cast<long long>(epoch), static_cast<long long>(seen),
                    static_cast<long long>(task.train_size()),
                    100.0 * static_cast<double>(b) / static_cast<double>(batches_per_epoch),
                    shown_loss,
                    format_duration(eta_seconds(seconds_since(epoch_start), b + 1 - first_batch,
                                                batches - first_batch)).c_str());
        std::fflush(stdout);
      }
    }
    // The bar: redrawn in place at most 10 times a second, and after the last batch.
    if (progress == ProgressMode::Bar &&
        (b + 1 == batches || Clock::now() - drawn >= std::chrono::milliseconds(100))) {
      drawn = Clock::now();
      const double elapsed = seconds_since(epoch_start);
      const double rate = elapsed > 0 ? static_cast<double>((samples - restored.samples) *
                                                            group_.size()) / elapsed
                                      : 0.0;
      const std::string line =
          format_progress_bar(epoch, b + 1, batches, rate, shown_loss, elapsed, terminal_width());
      std::printf("\r%s\033[K", line.c_str());
      std::fflush(stdout);
      bar_drawn = true;
    }
  }
  if (bar_drawn) std::printf("\n");
  const double seconds = restored.seconds + seconds_since(epoch_start);
  local.sync = ddp_ ? ddp_->sync_seconds() - sync_at_start : 0.0;
  local.forward_backward -= local.sync;  // the sync ran inside backward

  std::vector<double> values{loss_sum.item<double>(), static_cast<double>(samples), local.data,
                             local.forward_backward, local.sync, local.optimizer};
  for (const torch::Tensor& m : metric_sums) values.push_back(m.item<double>());
  torch::Tensor sums = torch::tensor(values, torch::kDouble);
  comm.all_reduce(sums, ReduceOp::Sum);
  torch::Tensor slowest = torch::tensor({seconds}, torch::kDouble);
  comm.all_reduce(slowest, ReduceOp::Max);

  const auto s = sums.accessor<double, 1>();
  const double ranks = group_.size();
  EpochResult result;
  result.epoch = epoch;
  result.samples = static_cast<int64_t>(s[1]);
  result.train_loss = s[1] > 0 ? s[0] / s[1] : 0.0;
  result.seconds = slowest.item<double>();
  result.samples_per_sec = result.seconds > 0 ? s[1] / result.seconds : 0.0;
  result.phases = PhaseTimes{s[2] / ranks, s[3] / ranks, s[4] / ranks, s[5] / ranks};
  const std::vector<std::string> names = task.train_metrics();
  for (size_t i = 0; i < metric_count; ++i) {
    result.train_metrics.push_back(Metric{names[i], s[6 + i], result.samples});
  }
  return result;
}

void Trainer::optimizer_step() {
  // The gradients are averaged (DDP's backward): every rank clips, skips and steps alike.
  if (scaler_ && options_.clip_grad_norm > 0) scaler_->unscale_(optimizer_);
  if (options_.clip_grad_norm > 0) clip_grad_norm(model_.parameters(), options_.clip_grad_norm);
  if (scaler_) {
    scaler_->step(optimizer_);
    scaler_->update();
  } else {
    optimizer_.step();
  }
  if (options_.lr_schedule) options_.lr_schedule->step();
}

Evaluation Trainer::evaluate() {
  TrainingTask& task = this->task();
  Communicator& comm = group_.cpu();
  const torch::Device device = group_.device();
  model_.eval();
  torch::NoGradGuard no_grad;
  const std::vector<std::string> names = task.test_metrics();
  const int64_t size = task.test_size();

  const std::vector<int64_t> shard = evaluation_shard(size, group_.size(), group_.rank());
  const int64_t n = static_cast<int64_t>(shard.size());
  const auto doubles = torch::TensorOptions().dtype(torch::kDouble).device(device);
  torch::Tensor loss_sum = torch::zeros({}, doubles);
  std::vector<torch::Tensor> metric_sums(names.size());
  for (auto& m : metric_sums) m = torch::zeros({}, doubles);
  int64_t samples = 0;
  for (int64_t begin = 0; begin < n; begin += options_.test_batch_size) {
    const int64_t end = std::min(n, begin + options_.test_batch_size);
    std::any batch = task.test_batch_any(
        std::vector<int64_t>(shard.begin() + begin, shard.begin() + end), device);
    const StepOutput out = task.evaluate_any(batch);
    if (out.loss_sum.defined()) {
      loss_sum += out.loss_sum.to(torch::kDouble).sum();
    } else if (out.loss.defined()) {
      loss_sum += out.loss.to(torch::kDouble).sum() * static_cast<double>(out.samples);
    } else {
      throw std::runtime_error("Trainer: the task's evaluate() returned neither a loss nor a loss sum");
    }
    samples += out.samples;
    add_sums(metric_sums, out.sums, "evaluate()", "test_metrics");
  }
  std::vector<double> values{loss_sum.item<double>(), static_cast<double>(samples)};
  for (const torch::Tensor& m : metric_sums) values.push_back(m.item<double>());
  torch::Tensor totals = torch::tensor(values, torch::kDouble);
  comm.all_reduce(totals, ReduceOp::Sum);

  const auto t = totals.accessor<double, 1>();
  Evaluation result;
  result.total = static_cast<int64_t>(t[1]);
  result.loss = result.total ? t[0] / static_cast<double>(result.total) : 0.0;
  for (size_t i = 0; i < names.size(); ++i) {
    result.metrics.push_back(Metric{names[i], t[2 + i], result.total});
    if (names[i] == "accuracy") result.correct = static_cast<int64_t>(t[2 + i]);
  }
  return result;
}

std::vector<EpochResult> Trainer::fit(int64_t epochs, torch::optim::LRScheduler* scheduler) {
  TrainingTask& task = this->task();
  // An empty set would train nothing and report "0/0 (0%)" as if all were well.
  if (task.train_size() <= 0) throw std::invalid_argument("Trainer::fit: the training set is empty");
  if (scheduler && options_.lr_schedule) {
    throw std::invalid_argument("Trainer::fit: a per-epoch scheduler and TrainerOptions::lr_schedule "
                                "would both set the learning rate; use one");
  }
  std::vector<EpochResult> results;
  stopped_by_ = 0;
  stop_snapshot_.clear();
  const int64_t first_epoch = options_.checkpoint.resume.empty() ? 1 : resume(scheduler);
  // A resumed run continues the metrics of the run it resumes; a fresh one starts a new file.
  open_metrics(first_epoch > 1 || resume_batches_ > 0 ? first_epoch - 1 : -1);
  for (int64_t epoch = first_epoch; epoch <= epochs; ++epoch) {
    EpochResult r = train_epoch(epoch);
    if (stopped_by_) break;
    std::optional<Evaluation> eval;
    if (task.test_size() > 0) {
      eval = evaluate();
      r.test_loss = eval->loss;
      r.test_metrics = eval->metrics;
      for (const Metric& m : eval->metrics) {
        if (m.name == "accuracy") r.test_accuracy = eval->accuracy();
      }
    }
    if (group_.is_main()) {
      const std::string unit = group_.replicas_per_process() > 1 ? "replica(s)" : "rank(s)";
      // The seed's line for a classifier; the task's metrics (means per sample) after it.
      auto metrics = [](const std::vector<Metric>& list) {
        std::string text;
        char value[64];
        for (const Metric& m : list) {
          if (m.name == "accuracy") continue;
          std::snprintf(value, sizeof value, ", %s: %.6g", m.name.c_str(), m.mean());
          text += value;
        }
        return text;
      };
      if (eval) {
        std::printf("\nTest set: Average loss: %.4f", eval->loss);
        if (r.test_accuracy) {
          std::printf(", Accuracy: %lld/%lld (%.0f%%)", static_cast<long long>(eval->correct),
                      static_cast<long long>(eval->total), 100.0 * eval->accuracy());
        }
        std::printf("%s\n", metrics(eval->metrics).c_str());
      }
      if (!r.train_metrics.empty()) {
        std::printf("%sTrain set: Average loss: %.4f%s\n", eval ? "" : "\n", r.train_loss,
                    metrics(r.train_metrics).c_str());
      }
      std::printf("\n");
      const PhaseTimes& p = r.phases;
      std::printf("Epoch %lld: %.2f s, %.0f samples/s over %d %s | data %s, forward+backward "
                  "%s, gradient sync %s, optimizer %s\n\n",
                  static_cast<long long>(epoch), r.seconds, r.samples_per_sec,
                  group_.size(), unit.c_str(), percent(p.data, r.seconds).c_str(),
                  percent(p.forward_backward, r.seconds).c_str(),
                  percent(p.sync, r.seconds).c_str(), percent(p.optimizer, r.seconds).c_str());
      std::fflush(stdout);
    }
    write_metrics(r);
    results.push_back(r);
    if (scheduler) scheduler->step();
    checkpoint(epoch);
    if (options_.dry_run) break;
  }
  if (group_.is_main() && !results.empty()) {
    std::printf("Summary over %d %s:\n%s", group_.size(),
                group_.replicas_per_process() > 1 ? "replica(s)" : "rank(s)",
                summary_table(results).c_str());
    std::fflush(stdout);
  }
  return results;
}

std::string summary_table(const std::vector<EpochResult>& epochs) {
  if (epochs.empty()) return "";
  // The columns follow the first epoch: every epoch of a run has the same.
  const EpochResult& first = epochs.front();
  std::vector<std::string> extra;  // a column per metric other than accuracy
  for (const Metric& m : first.train_metrics) extra.push_back("train_" + m.name);
  const size_t train_extra = extra.size();
  for (const Metric& m : first.test_metrics) {
    if (m.name != "accuracy") extra.push_back("test_" + m.name);
  }
  const auto width = [](const std::string& name) {
    return static_cast<int>(std::max<size_t>(10, name.size()));
  };
  std::string table = "epoch  train loss";
  char cell[96];
  for (size_t i = 0; i < train_extra; ++i) {
    std::snprintf(cell, sizeof cell, "  %*s", width(extra[i]), extra[i].c_str());
    table += cell;
  }
  if (first.test_loss) table += "  test loss";
  if (first.test_accuracy) table += "  test acc";
  for (size_t i = train_extra; i < extra.size(); ++i) {
    std::snprintf(cell, sizeof cell, "  %*s", width(extra[i]), extra[i].c_str());
    table += cell;
  }
  table += "  time (s)  samples/s    sync\n";
  for (const EpochResult& e : epochs) {
    std::snprintf(cell, sizeof cell, "%5lld  %10.4f", static_cast<long long>(e.epoch), e.train_loss);
    table += cell;
    for (size_t i = 0; i < train_extra; ++i) {
      std::snprintf(cell, sizeof cell, "  %*.6g", width(extra[i]),
                    i < e.train_metrics.size() ? e.train_metrics[i].mean() : 0.0);
      table += cell;
    }
    if (first.test_loss) {
      std::snprintf(cell, sizeof cell, "  %9.4f", e.test_loss.value_or(0.0));
      table += cell;
    }
    if (first.test_accuracy) {
      std::snprintf(cell, sizeof cell, "  %7.2f%%", 100.0 * e.test_accuracy.value_or(0.0));
      table += cell;
    }
    size_t column = train_extra;
    for (const Metric& m : e.test_metrics) {
      if (m.name == "accuracy" || column >= extra.size()) continue;
      std::snprintf(cell, sizeof cell, "  %*.6g", width(extra[column++]), m.mean());
      table += cell;
    }
    std::snprintf(cell, sizeof cell, "  %8.2f  %9.0f  %6s\n", e.seconds, e.samples_per_sec,
                  percent(e.phases.sync, e.seconds).c_str());
    table += cell;
  }
  return table;
}

Trainer::Boundary Trainer::at_boundary(int64_t b, int64_t first_batch) {
  const int64_t check = options_.stop_check_every;
  if (check > 0 && global_step_ % check == 0) {
    // Every rank says whether it got a stop signal; the maximum tells each rank the same
    // answer, so all stop before the same batch. Doubles carry the signal and rank exactly.
    const int signal = stop_signal();
    torch::Tensor flag =
        torch::tensor({static_cast<double>(signal), signal ? double(group_.rank()) : -1.0,
                       seconds_since_stop_signal()},
                      torch::kDouble);
    group_.cpu().all_reduce(flag, ReduceOp::Max);
    const auto f = flag.accessor<double, 1>();
    if (f[0] > 0) {
      stopped_by_ = static_cast<int>(f[0]);
      stop_rank_ = static_cast<int>(f[1]);
      stop_seconds_ = f[2];
      stop_checked_at_ = Clock::now();
      return Boundary::Stop;
    }
  }
  const int64_t every = options_.checkpoint.every_steps;
  // Not before a first batch: nothing was trained since the epoch-end (or resumed) snapshot.
  if (every > 0 && b > first_batch && global_step_ % every == 0) return Boundary::Save;
  return Boundary::Continue;
}

void Trainer::save_inside_epoch(const std::string& path, int64_t epoch, int64_t b,
                                const EpochSums& sums, at::Generator& augment_generator) {
  TrainingProgress progress;
  progress.epoch = epoch - 1;
  progress.batches_done = b;
  progress.global_step = global_step_;
  progress.seed = options_.seed;
  progress.world_size = group_.size();
  RankState state;
  state.generator = augment_generator.get_state();
  const PhaseTimes& p = sums.phases;
  std::vector<double> values{sums.loss,          sums.samples, sums.seconds, p.data,
                             p.forward_backward, p.sync,       p.optimizer};
  values.insert(values.end(), sums.metrics.begin(), sums.metrics.end());
  state.values = torch::tensor(values, torch::kDouble);
  if (group_.is_main()) {
    std::error_code error;
    std::filesystem::create_directories(options_.checkpoint.dir, error);
    if (error) {
      throw std::runtime_error(options_.checkpoint.dir +
                               ": cannot create the checkpoint directory: " + error.message());
    }
  }
  save_snapshot(path, group_.cpu(), model_, optimizer_, progress, state, extras());
  if (group_.is_main()) remove_older_inside_epoch_snapshots(path);
}

void Trainer::report_stop(int64_t epoch, int64_t b) {
  if (!group_.is_main()) return;
  const std::string what = std::string(stop_signal_name(stopped_by_)) + " (rank " +
                           std::to_string(stop_rank_) + ")";
  // From the signal to the check (on the rank that got it), then the snapshot.
  const double waited = stop_seconds_ + seconds_since(stop_checked_at_);
  if (stop_snapshot_.empty()) {
    std::printf("Stopped by %s before batch %lld of epoch %lld (step %lld); nothing saved: "
                "TrainerOptions::checkpoint.dir is empty (%.2f s after the signal)\n",
                what.c_str(), static_cast<long long>(b), static_cast<long long>(epoch),
                static_cast<long long>(global_step_), waited);
  } else {
    std::printf("Stopped by %s before batch %lld of epoch %lld (step %lld): wrote %s %.2f s "
                "after the signal; resume from it to continue\n",
                what.c_str(), static_cast<long long>(b), static_cast<long long>(epoch),
                static_cast<long long>(global_step_), stop_snapshot_.c_str(), waited);
  }
  std::fflush(stdout);
}

void Trainer::remove_older_inside_epoch_snapshots(const std::string& newest) {
  bool older = false;
  for (const std::string& path : list_snapshots(options_.checkpoint.dir)) {
    if (path == newest) {
      older = true;
    } else if (older && path.find("_batch") != std::string::npos) {
      std::remove(path.c_str());
    }
  }
}

void Trainer::open_metrics(int64_t finished_epochs) {
  if (!group_.is_main() || options_.metrics_file.empty()) return;
  const std::string& file = options_.metrics_file;
  if (metrics_.is_open()) metrics_.close();
  if (finished_epochs >= 0) {
    // Resumed: keep the lines of the epochs the snapshot had finished, drop any of later epochs
    // (written after the snapshot by the run that stopped; this run trains them again).
    std::ifstream in(file);
    std::string kept, line;
    bool dropped = false;
    while (std::getline(in, line)) {
      const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (json.is_object() && json.contains("epoch") && json["epoch"].is_number_integer() &&
          json["epoch"].get<int64_t>() > finished_epochs) {
        dropped = true;
        continue;
      }
      kept += line + "\n";
    }
    if (dropped) {
      write_atomically(file, kept);  // names the file and errno's reason on failure
    }
  }
  metrics_.open(file, finished_epochs >= 0 ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw std::runtime_error(file + ": cannot open the metrics file for writing");
}

int64_t Trainer::resume(torch::optim::LRScheduler* scheduler) {
  const CheckpointOptions& c = options_.checkpoint;
  Communicator& comm = group_.cpu();
  const bool latest = c.resume == "latest";
  // Rank 0 looks for the files and names them; load_snapshot sends each rank the bytes, so
  // only rank 0 needs to see the checkpoint directory.
  std::string names;
  if (group_.is_main()) {
    for (const auto& path : latest ? list_snapshots(c.dir) : std::vector<std::string>{c.resume}) {
      names += path + "\n";
    }
  }
  std::vector<std::string> candidates;
  std::istringstream lines(all_gather_strings(comm, names)[0]);
  for (std::string line; std::getline(lines, line);) candidates.push_back(line);
  if (candidates.empty()) {
    if (group_.is_main()) std::printf("No snapshot in %s: starting at epoch 1\n", c.dir.c_str());
    return 1;
  }
  for (size_t i = 0;; ++i) {
    const std::string& path = candidates[i];
    try {
      RankState state;
      const TrainingProgress p =
          load_snapshot(path, comm, model_, optimizer_, scheduler, &state, extras());
      global_step_ = p.global_step;
      resume_epoch_ = p.epoch + 1;
      resume_batches_ = p.batches_done;
      resume_state_ = state;
      if (group_.is_main()) {
        if (p.batches_done > 0) {
          std::printf("Resumed from %s: epoch %lld done, %lld batches of epoch %lld, step %lld\n",
                      path.c_str(), static_cast<long long>(p.epoch),
                      static_cast<long long>(p.batches_done), static_cast<long long>(p.epoch + 1),
                      static_cast<long long>(p.global_step));
        } else {
          std::printf("Resumed from %s: epoch %lld done, step %lld\n", path.c_str(),
                      static_cast<long long>(p.epoch), static_cast<long long>(p.global_step));
        }
        if (p.world_size != group_.size()) {
          std::printf("Warning: the snapshot was written by %d rank(s), this run has %d: the "
                      "data order differs from an uninterrupted run\n",
                      p.world_size, group_.size());
        }
        if (p.seed != options_.seed) {
          std::printf("Warning: continuing with the snapshot's seed %lld (not %lld) so the data "
                      "order continues as it was\n",
                      static_cast<long long>(p.seed), static_cast<long long>(options_.seed));
        }
        std::fflush(stdout);
      }
      options_.seed = p.seed;
      return p.epoch + 1;
    } catch (const std::runtime_error& e) {
      if (!(latest && c.fallback) || i + 1 == candidates.size()) throw;
      if (group_.is_main()) {
        std::fprintf(stderr, "Warning: %s; trying the previous snapshot\n", e.what());
      }
    }
  }
}

void Trainer::checkpoint(int64_t epoch) {
  const CheckpointOptions& c = options_.checkpoint;
  if (c.dir.empty()) return;
  auto model_path = [&](int64_t e) {
    return c.dir + "/model_with_epoch" + std::to_string(e) + ".pt";
  };
  if (group_.is_main()) {
    std::error_code error;
    std::filesystem::create_directories(c.dir, error);
    if (error) throw std::runtime_error(c.dir + ": cannot create the checkpoint directory: " + error.message());
    save_module(model_, model_path(epoch));
  }
  TrainingProgress progress;
  progress.epoch = epoch;
  progress.global_step = global_step_;
  progress.seed = options_.seed;
  progress.world_size = group_.size();
  save_snapshot(snapshot_path(c.dir, epoch), group_.cpu(), model_, optimizer_, progress, {},
                extras());
  if (group_.is_main()) remove_older_inside_epoch_snapshots(snapshot_path(c.dir, epoch));
  if (group_.is_main() && c.keep > 0 && epoch > c.keep) {
    // Only after the new files are complete; removing what is absent is fine.
    const int64_t old = epoch - c.keep;
    std::remove(snapshot_path(c.dir, old).c_str());
    std::remove(model_path(old).c_str());
  }
}

void Trainer::write_metrics(const EpochResult& r) {
  if (!metrics_.is_open()) return;
  // The task's metrics (means per sample) beside the loss of their set.
  nlohmann::ordered_json line = {{"epoch", r.epoch}, {"train_loss", r.train_loss}};
  for (const Metric& m : r.train_metrics) line["train_" + m.name] = m.mean();
  if (r.test_loss) line["test_loss"] = *r.test_loss;
  if (r.test_accuracy) line["test_accuracy"] = *r.test_accuracy;
  for (const Metric& m : r.test_metrics) {
    if (m.name != "accuracy") line["test_" + m.name] = m.mean();
  }
  line["samples_per_sec"] = r.samples_per_sec;
  line["seconds"] = r.seconds;
  line["samples"] = r.samples;
  line["ranks"] = group_.size();
  line["data_seconds"] = r.phases.data;
  line["forward_backward_seconds"] = r.phases.forward_backward;
  line["sync_seconds"] = r.phases.sync;
  line["optimizer_seconds"] = r.phases.optimizer;
  metrics_ << line.dump() << "\n" << std::flush;
  if (!metrics_) throw std::runtime_error(options_.metrics_file + ": write failed");
}

}  // namespace ddp

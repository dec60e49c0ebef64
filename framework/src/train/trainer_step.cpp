// The Trainer's work on one batch, its optimizer step, and evaluation (trainer.h).
#include <ddp/train/trainer.h>
#include <ddp/runtime.h>

#include <ddp/train/grad_clip.h>
#include <ddp/train/replica_check.h>

#include "util/clock.h"
#include "util/testing_hooks.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

namespace ddp {

namespace {

// Throws naming the task's method when its sums break the contract (task.h): one scalar per
// metric name.
void check_sums(const StepOutput& out, size_t metrics, const char* method, const char* names) {
  if (out.sums.size() != metrics) {
    throw std::runtime_error("Trainer: the task's " + std::string(method) + " returned " +
                             std::to_string(out.sums.size()) + " metric sum(s) for the " +
                             std::to_string(metrics) + " name(s) of its " + names + "()");
  }
  for (size_t i = 0; i < out.sums.size(); ++i) {
    if (!out.sums[i].defined() || out.sums[i].numel() != 1) {
      throw std::runtime_error("Trainer: the task's " + std::string(method) +
                               " returned metric sum " + std::to_string(i) +
                               " that is not a scalar tensor");
    }
  }
}

// A number as %g writes it: "nan", "inf", "1e+30", "0.5".
std::string number_text(double value) {
  if (std::isnan(value)) return "nan";  // not glibc's "-nan"
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

}  // namespace

StepOutput Trainer::step(int64_t epoch, int64_t b, int64_t batches, at::Generator& generator,
                         EpochMeter& meter) {
  const int64_t accumulate = options_.accumulate;
  const bool group_start = b % accumulate == 0;
  const bool group_end = (b + 1) % accumulate == 0 || b + 1 == batches;
  PhaseTimes& phases = meter.phases();
  // Times one phase into `total` and, when recording, into the timeline.
  auto phase = [this](const char* name, double& total, auto&& body) {
    const auto start = Clock::now();
    body();
    const auto end = Clock::now();
    total += std::chrono::duration<double>(end - start).count();
    if (options_.timeline) options_.timeline->span(name, "step", start, end);
  };

  std::any batch;
  phase("data", phases.data, [&] {
    batch = source_->next();
    task_.prepare_any(batch, generator);
  });
  if (group_start) {
    // Gradients that are views into DDP's buckets (gradient_as_bucket_view) are zeroed in place:
    // reset, backward would allocate them again and copy them into the buckets.
    const bool set_to_none = !(ddp_ && ddp_->options().gradient_as_bucket_view);
    phase("zero_grad", phases.optimizer, [&] { optimizer_.zero_grad(set_to_none); });
  }
  // The buffer broadcast belongs to forward, as in PyTorch's DDP.
  if (ddp_) phase("forward", phases.forward_backward, [&] { ddp_->prepare_forward(); });
  const int64_t check = options_.check_sync_every;
  if (group_start && check > 0 && global_step_ % check == 0) {
    // Here, after the buffer broadcast and before forward, healthy replicas are identical.
    // A diagnostic: its time counts in no phase.
    check_replicas_in_sync(
        model_, group_.cpu(),
        "at step " + std::to_string(global_step_) + " (epoch " + std::to_string(epoch) + ")");
  }
  StepOutput out;
  phase("forward", phases.forward_backward, [&] {
    std::optional<Autocast> autocast;
    if (options_.amp != AmpMode::Off) {
      autocast.emplace(group_.device().type(),
                       options_.amp == AmpMode::Fp16 ? torch::kHalf : torch::kBFloat16);
    }
    out = task_.loss_any(batch);
  });
  if (!out.loss.defined() || out.loss.numel() != 1) {
    throw std::runtime_error(
        "Trainer: the task's loss() returned " +
        std::string(out.loss.defined()
                        ? "a loss of " + std::to_string(out.loss.numel()) + " elements"
                        : "no loss") +
        " (step " + std::to_string(global_step_) + "); it must be the batch's mean, a scalar");
  }
  check_sums(out, meter.metrics().size(), "loss()", "train_metrics");
  const torch::Tensor loss = out.loss.reshape({});
  phase("backward", phases.forward_backward, [&] {
    // Not the last micro-batch of a group: accumulate locally, no communication.
    std::optional<DistributedDataParallel::NoSync> no_sync;
    if (ddp_ && !group_end) no_sync.emplace(*ddp_);
    torch::Tensor scaled = accumulate > 1 ? loss / static_cast<double>(accumulate) : loss;
    if (scaler_) scaled = scaler_->scale(scaled);
    scaled.backward();
  });
  // On a GPU, backward has mostly only been queued here: the source makes the next batch while
  // the GPU computes (ImageDataset::gather copies on a side stream). Only the gather moves:
  // prepare() stays in its step, so the generator's draws keep their order and training is
  // bit-identical to gathering at the start of each step.
  if (b + 1 < batches) phase("data", phases.data, [&] { source_->ahead(); });
  // The meter counts a group's micro-batches once its step is kept (the same additions in the
  // same order as adding each at once): a dropped step's NaN stays out of the epoch's sums.
  pending_.push_back(PendingBatch{loss.detach(), out.samples, out.sums});
  if (group_end) {
    bool dropped = false, losses_finite = true;
    phase("optimizer", phases.optimizer, [&] {
      // Read before the step, not after: on a GPU the host then goes on to the next batch while
      // the optimizer's kernels run. The read waits for backward, which the gradient check or
      // the GradScaler waits for next anyway. Agreed at the next stop check (stop_at) or the
      // epoch's end (fit), and counted only for a step that is kept.
      if (nonfinite_loss_step_ < 0) {
        std::vector<torch::Tensor> losses;
        for (const PendingBatch& p : pending_) losses.push_back(p.loss.reshape({}));
        losses_finite = torch::isfinite(torch::stack(losses)).all().item<bool>();
      }
      dropped = optimizer_step(epoch);
    });
    ++global_step_;
    if (!dropped) {
      for (const PendingBatch& p : pending_) meter.add(p.loss, p.samples, p.sums);
      if (!losses_finite) nonfinite_loss_step_ = global_step_;
    }
    pending_.clear();
    if (const auto& after_step = testing::hooks().after_step)
      after_step(global_step_, group_.rank());
  }
  out.loss = loss.detach();
  return out;
}

bool Trainer::optimizer_step(int64_t epoch) {
  // The gradients are averaged (DDP's backward): every rank clips, checks, skips and steps alike.
  if (scaler_ && options_.clip_grad_norm > 0) scaler_->unscale_(optimizer_);
  double norm = 0;
  std::string norm_name = "largest |gradient|";
  const auto& groups = optimizer_.param_groups();
  if (!groups.empty()) step_lr_ = groups.front().options().get_lr();  // before the schedule steps
  if (options_.clip_grad_norm > 0) {
    norm = clip_grad_norm(model_.parameters(), options_.clip_grad_norm);
    norm_name = "gradient 2-norm";
    step_grad_norm_ = norm;
  } else if (!scaler_) {
    norm = largest_abs_gradient(model_.parameters());
  }
  // Under fp16 the GradScaler skips non-finite steps itself (TrainerOptions::on_nonfinite).
  if (!scaler_ && !std::isfinite(norm)) {
    const int64_t step = global_step_ + 1;
    std::string what = "the gradients are not finite (" + norm_name + " " + number_text(norm) + ")";
    if (options_.on_nonfinite == OnNonFinite::Stop) diverged(what, step, epoch);
    if (skipped_in_a_row_ >= options_.max_skipped_steps) {
      diverged(what + ", after " + std::to_string(skipped_in_a_row_) +
                   " dropped step(s) in a row (TrainerOptions::max_skipped_steps)",
               step, epoch);
    }
    ++skipped_in_a_row_;
    ++skipped_total_;
    reporter_.end_epoch();  // ends a progress bar's line
    if (group_.is_main()) {
      std::printf(
          "Skipped step %lld (epoch %lld): %s; %lld in a row (at most %lld), "
          "%lld in this run\n",
          static_cast<long long>(step), static_cast<long long>(epoch), what.c_str(),
          static_cast<long long>(skipped_in_a_row_),
          static_cast<long long>(options_.max_skipped_steps),
          static_cast<long long>(skipped_total_));
      std::fflush(stdout);
    }
    if (options_.lr_schedule) options_.lr_schedule->step();  // counts steps, as with GradScaler
    return true;
  }
  if (!scaler_) skipped_in_a_row_ = 0;
  if (scaler_) {
    scaler_->step(optimizer_);
    scaler_->update();
  } else if (!optimizer_step_overlapped()) {  // else backward stepped it
    optimizer_.step();
  }
  if (options_.lr_schedule) options_.lr_schedule->step();
  return false;
}

void Trainer::diverged(const std::string& what, int64_t step, int64_t epoch) {
  reporter_.end_epoch();
  const auto& groups = optimizer_.param_groups();
  const std::string lr = groups.empty() ? "?" : number_text(groups.front().options().get_lr());
  throw TrainingDiverged("Training diverged at step " + std::to_string(step) + " (epoch " +
                             std::to_string(epoch) + "): " + what + ", learning rate " + lr +
                             ". Stopped before any non-finite snapshot; try a lower learning "
                             "rate or gradient clipping (TrainerOptions::clip_grad_norm)",
                         step, epoch);
}

Evaluation Trainer::evaluate() {
  const torch::Device device = group_.device();
  // Rank 0's buffers (BatchNorm statistics) everywhere, as PyTorch's first forward after training
  // gives them: each rank then scores its shard with the model rank 0 saves.
  if (ddp_) ddp_->prepare_forward();
  model_.eval();
  torch::NoGradGuard no_grad;
  const std::vector<std::string> names = task_.test_metrics();
  const std::vector<int64_t> shard =
      evaluation_shard(task_.test_size(), group_.size(), group_.rank());
  const int64_t n = static_cast<int64_t>(shard.size());
  const auto doubles = torch::TensorOptions().dtype(torch::kDouble).device(device);
  torch::Tensor loss_sum = torch::zeros({}, doubles);
  std::vector<torch::Tensor> metric_sums(names.size());
  for (auto& m : metric_sums) m = torch::zeros({}, doubles);
  int64_t samples = 0;
  // A rank that hangs in its own computation never reaches the collective below.
  WatchedPhase phase("evaluation");
  for (int64_t begin = 0; begin < n; begin += options_.test_batch_size) {
    phase.progress();
    const int64_t end = std::min(n, begin + options_.test_batch_size);
    std::any batch = task_.test_batch_any(
        std::vector<int64_t>(shard.begin() + begin, shard.begin() + end), device);
    const StepOutput out = task_.evaluate_any(batch);
    if (!out.loss_sum.defined() && !out.loss.defined()) {
      throw std::runtime_error(
          "Trainer: the task's evaluate() returned neither a loss nor a loss sum");
    }
    check_sums(out, names.size(), "evaluate()", "test_metrics");
    loss_sum += out.loss_sum.defined()
                    ? out.loss_sum.to(torch::kDouble).sum()
                    : out.loss.to(torch::kDouble).sum() * static_cast<double>(out.samples);
    samples += out.samples;
    for (size_t i = 0; i < names.size(); ++i) {
      metric_sums[i] += out.sums[i].detach().to(device, torch::kDouble).reshape({});
    }
  }
  std::vector<double> values{loss_sum.item<double>(), static_cast<double>(samples)};
  for (const torch::Tensor& m : metric_sums) values.push_back(m.item<double>());
  torch::Tensor totals = torch::tensor(values, torch::kDouble);
  group_.cpu().all_reduce(totals, ReduceOp::Sum);

  const auto t = totals.accessor<double, 1>();
  Evaluation result;
  result.samples = static_cast<int64_t>(t[1]);
  result.loss = result.samples ? t[0] / static_cast<double>(result.samples) : 0.0;
  for (size_t i = 0; i < names.size(); ++i) {
    result.metrics.push_back(Metric{names[i], t[2 + i], result.samples});
  }
  return result;
}

}  // namespace ddp

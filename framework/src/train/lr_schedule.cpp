#include <ddp/train/lr_schedule.h>

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

namespace ddp {

LRDecay parse_lr_decay(const std::string& text) {
  if (text == "constant") return LRDecay::Constant;
  if (text == "cosine") return LRDecay::Cosine;
  if (text == "step") return LRDecay::Step;
  throw std::invalid_argument("learning-rate decay '" + text +
                              "': expected constant, cosine or step");
}

namespace {

void require(bool ok, const std::string& option, const std::string& rule, double got) {
  if (ok) return;
  std::string value = std::to_string(got);
  if (got == std::floor(got) && std::isfinite(got))
    value = std::to_string(static_cast<long long>(got));
  throw std::invalid_argument("LRScheduleOptions::" + option + " must be " + rule + " (got " +
                              value + ")");
}

}  // namespace

LRSchedule::LRSchedule(torch::optim::Optimizer& optimizer, LRScheduleOptions options)
    : optimizer_(optimizer), options_(options) {
  const LRScheduleOptions& o = options_;
  require(o.warmup_steps >= 0, "warmup_steps", ">= 0", static_cast<double>(o.warmup_steps));
  // NaN fails every comparison, so it is refused too.
  require(o.warmup_start_factor > 0 && o.warmup_start_factor <= 1, "warmup_start_factor",
          "in (0, 1]", o.warmup_start_factor);
  if (o.decay == LRDecay::Cosine) {
    require(o.decay_steps >= 1, "decay_steps", ">= 1 with the cosine decay",
            static_cast<double>(o.decay_steps));
    require(std::isfinite(o.min_lr) && o.min_lr >= 0, "min_lr", "finite and >= 0", o.min_lr);
  }
  if (o.decay == LRDecay::Step) {
    require(o.step_size >= 1, "step_size", ">= 1", static_cast<double>(o.step_size));
    require(std::isfinite(o.gamma) && o.gamma >= 0, "gamma", "finite and >= 0", o.gamma);
  }
  require(o.reference_batch >= 0, "reference_batch", ">= 0",
          static_cast<double>(o.reference_batch));
  if (o.reference_batch > 0) {
    require(o.global_batch >= 1, "global_batch", ">= 1 when reference_batch is set",
            static_cast<double>(o.global_batch));
  }
  for (const auto& group : optimizer_.param_groups()) {
    base_lrs_.push_back(
        scale_lr_with_batch(group.options().get_lr(), o.global_batch, o.reference_batch));
  }
  apply();
}

std::vector<double> LRSchedule::lrs_at(int64_t t) const {
  const LRScheduleOptions& o = options_;
  const double pi = std::acos(-1.0);
  std::vector<double> lrs;
  for (double base : base_lrs_) {
    double lr = base;
    if (t < o.warmup_steps) {
      const double f = o.warmup_start_factor;
      lr = base * (f + (1.0 - f) * static_cast<double>(t) / static_cast<double>(o.warmup_steps));
    } else {
      const int64_t u = t - o.warmup_steps;
      switch (o.decay) {
        case LRDecay::Constant:
          break;
        case LRDecay::Cosine:
          lr = o.min_lr + (base - o.min_lr) *
                              (1.0 + std::cos(pi * static_cast<double>(u) /
                                              static_cast<double>(o.decay_steps))) /
                              2.0;
          break;
        case LRDecay::Step:
          lr = base * std::pow(o.gamma, static_cast<double>(u / o.step_size));
          break;
      }
    }
    lrs.push_back(lr);
  }
  return lrs;
}

void LRSchedule::apply() {
  const std::vector<double> lrs = lrs_at(position_);
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lrs[g]);
}

void LRSchedule::step() {
  ++position_;
  apply();
}

void LRSchedule::save(torch::serialize::OutputArchive& archive) const {
  archive.write("position", torch::tensor({position_}, torch::kLong));
  archive.write("base_lrs", torch::tensor(base_lrs_, torch::kDouble));
}

void LRSchedule::load(torch::serialize::InputArchive& archive) {
  torch::Tensor position, base;
  archive.read("position", position);
  archive.read("base_lrs", base);
  if (base.numel() != static_cast<int64_t>(optimizer_.param_groups().size())) {
    throw std::runtime_error("LRSchedule::load: the saved schedule has " +
                             std::to_string(base.numel()) + " parameter group(s), the optimizer " +
                             std::to_string(optimizer_.param_groups().size()));
  }
  const int64_t t = position.item<int64_t>();
  if (t < 0) throw std::runtime_error("LRSchedule::load: negative position " + std::to_string(t));
  position_ = t;  // the base rates stay this schedule's (the header says why)
  apply();
}

double scale_lr_with_batch(double lr, int64_t global_batch, int64_t reference_batch) {
  if (reference_batch < 0) {
    throw std::invalid_argument(
        "scale_lr_with_batch: reference_batch must be >= 0 (0: no scaling), got " +
        std::to_string(reference_batch));
  }
  if (!std::isfinite(lr)) {
    throw std::invalid_argument("scale_lr_with_batch: lr must be finite, got " +
                                std::to_string(lr));
  }
  if (reference_batch == 0) return lr;
  if (global_batch < 1) {
    throw std::invalid_argument(
        "scale_lr_with_batch: global_batch must be >= 1 when reference_batch is set, got " +
        std::to_string(global_batch));
  }
  return lr * static_cast<double>(global_batch) / static_cast<double>(reference_batch);
}

void scale_lr_with_batch(torch::optim::Optimizer& optimizer, int64_t global_batch,
                         int64_t reference_batch) {
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(
        scale_lr_with_batch(group.options().get_lr(), global_batch, reference_batch));
  }
}

int64_t global_batch_size(int64_t batch_size, int64_t ranks, int64_t accumulate) {
  for (const auto& [name, value] :
       {std::make_pair("batch_size", batch_size), std::make_pair("ranks", ranks),
        std::make_pair("accumulate", accumulate)}) {
    if (value < 1) {
      throw std::invalid_argument(std::string("global_batch_size: ") + name +
                                  " must be >= 1, got " + std::to_string(value));
    }
  }
  return batch_size * ranks * accumulate;
}

}  // namespace ddp

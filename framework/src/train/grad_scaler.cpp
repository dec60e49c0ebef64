#include <ddp/train/grad_scaler.h>

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace ddp {

GradScaler::GradScaler(Communicator* comm, GradScalerOptions options)
    : comm_(comm), options_(options) {
  auto refuse = [](const std::string& option, const std::string& rule, double got) {
    throw std::invalid_argument("GradScalerOptions::" + option + " must be " + rule + " (got " +
                                std::to_string(got) + ")");
  };
  // Written so that NaN fails too.
  if (!(options_.init_scale > 0 && std::isfinite(options_.init_scale))) {
    refuse("init_scale", "finite and > 0", options_.init_scale);
  }
  if (!(options_.growth_factor > 1 && std::isfinite(options_.growth_factor))) {
    refuse("growth_factor", "finite and > 1", options_.growth_factor);
  }
  if (!(options_.backoff_factor > 0 && options_.backoff_factor < 1)) {
    refuse("backoff_factor", "in (0, 1)", options_.backoff_factor);
  }
  if (options_.growth_interval < 1) {
    refuse("growth_interval", ">= 1", static_cast<double>(options_.growth_interval));
  }
  // The scale starts on the CPU; scale() moves it to the loss's device the first time.
  scale_ = torch::full({}, options_.init_scale, torch::kFloat);
  growth_tracker_ = torch::zeros({}, torch::kInt);
}

void GradScaler::lazy_init(const torch::Device& device) {
  if (scale_.device() != device) {
    scale_ = scale_.to(device);
    growth_tracker_ = growth_tracker_.to(device);
  }
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!options_.enabled) return loss;
  if (per_optimizer_.empty()) lazy_init(loss.device());
  return loss * scale_.to(loss.device());
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::Unscaled) {
    throw std::logic_error(
        "GradScaler::unscale_: already called on this optimizer since the last "
        "update()");
  }
  if (state.stage == Stage::Stepped) {
    throw std::logic_error("GradScaler::unscale_: called after step(); call update() first");
  }
  // As PyTorch: 1/scale in double, then float; gradients grouped by device and dtype.
  const torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  torch::Tensor found_inf = torch::zeros({}, scale_.options().dtype(torch::kFloat));
  std::map<std::pair<std::string, torch::ScalarType>, std::vector<torch::Tensor>> groups;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      const torch::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      if (grad.scalar_type() == torch::kHalf) {
        throw std::invalid_argument(
            "GradScaler::unscale_: fp16 gradients (keep the parameters in fp32 and run the "
            "forward under ddp::Autocast)");
      }
      if (grad.is_sparse()) {
        throw std::invalid_argument("GradScaler::unscale_: sparse gradients are not supported");
      }
      groups[{grad.device().str(), grad.scalar_type()}].push_back(grad);
    }
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [key, grads] : groups) {
      const torch::Device device = grads.front().device();
      torch::Tensor local_found =
          torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
      at::_amp_foreach_non_finite_check_and_unscale_(grads, local_found, inv_scale.to(device));
      found_inf += local_found.to(found_inf.device());
    }
  }
  if (comm_ && comm_->size() > 1) {
    // Every rank must take the same decision (see the header): the largest flag of any rank.
    torch::Tensor flag = found_inf.to(torch::kCPU).reshape({1}).contiguous();
    comm_->all_reduce(flag, ReduceOp::Max);
    found_inf = flag.reshape({}).to(found_inf.device());
  }
  state.found_inf = found_inf;
  state.stage = Stage::Unscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  PerOptimizer& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::Stepped) {
    throw std::logic_error(
        "GradScaler::step: already called on this optimizer since the last "
        "update()");
  }
  if (state.stage == Stage::Ready) unscale_(optimizer);
  const bool stepped = state.found_inf.item<float>() == 0.0f;
  if (stepped) optimizer.step();
  state.stage = Stage::Stepped;
  return stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  torch::Tensor combined;
  for (auto& [optimizer, state] : per_optimizer_) {
    if (!state.found_inf.defined()) continue;
    const torch::Tensor here = state.found_inf.to(scale_.device());
    combined = combined.defined() ? combined + here : here.clone();
  }
  if (!combined.defined()) {
    throw std::logic_error("GradScaler::update: no unscale_() or step() since the last update()");
  }
  at::_amp_update_scale_(scale_, growth_tracker_, combined, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const { return options_.enabled ? scale_.item<double>() : 1.0; }

int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", scale_.to(torch::kCPU));
  archive.write("growth_tracker", growth_tracker_.to(torch::kCPU));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale, tracker;
  archive.read("scale", scale);
  archive.read("growth_tracker", tracker);
  if (scale.numel() != 1 || tracker.numel() != 1) {
    throw std::runtime_error("GradScaler::load: the scale and the growth tracker must be scalars");
  }
  const torch::Device device = scale_.device();
  scale_ = scale.reshape({}).to(torch::kFloat).to(device);
  growth_tracker_ = tracker.reshape({}).to(torch::kInt).to(device);
  per_optimizer_.clear();
}

}  // namespace ddp

#include <ddp/train/adadelta.h>

#include <torch/optim/serialize.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace ddp {

void AdadeltaOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(rho);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
}

void AdadeltaOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, rho);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
}

void AdadeltaParamState::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("square_avg", square_avg());
  archive.write("acc_delta", acc_delta());
}

void AdadeltaParamState::serialize(torch::serialize::InputArchive& archive) {
  torch::Tensor square, delta;
  archive.read("square_avg", square);
  archive.read("acc_delta", delta);
  square_avg(square);
  acc_delta(delta);
}

Adadelta::Adadelta(std::vector<torch::Tensor> params, AdadeltaOptions defaults)
    : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                std::make_unique<AdadeltaOptions>(defaults)) {
  // `!(x >= 0)` is true for NaN too: a NaN rate would silently turn every weight into NaN.
  auto check = [](const char* field, double value, bool ok) {
    if (ok && std::isfinite(value)) return;
    throw std::invalid_argument("Adadelta: invalid " + std::string(field) + " " +
                                std::to_string(value) + " (AdadeltaOptions::" + field +
                                " must be finite and " +
                                (std::string(field) == "rho" ? "in [0, 1]" : ">= 0") + ")");
  };
  check("lr", defaults.lr(), defaults.lr() >= 0);
  check("rho", defaults.rho(), defaults.rho() >= 0 && defaults.rho() <= 1);
  check("eps", defaults.eps(), defaults.eps() >= 0);
  check("weight_decay", defaults.weight_decay(), defaults.weight_decay() >= 0);
}

torch::Tensor Adadelta::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdadeltaOptions&>(group.options());
    const double lr = options.lr(), rho = options.rho(), eps = options.eps();
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      torch::Tensor grad = param.grad();
      if (options.weight_decay() != 0) grad = grad.add(param, options.weight_decay());

      auto& slot = state_[param.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<AdadeltaParamState>();
        fresh->square_avg(torch::zeros_like(param, at::MemoryFormat::Preserve));
        fresh->acc_delta(torch::zeros_like(param, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<AdadeltaParamState&>(*slot);
      torch::Tensor& square_avg = state.square_avg();
      torch::Tensor& acc_delta = state.acc_delta();
      // The exact operation order of torch.optim.Adadelta, so results match bit for bit.
      square_avg.mul_(rho).addcmul_(grad, grad, 1 - rho);
      torch::Tensor std = square_avg.add(eps).sqrt_();
      torch::Tensor delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad);
      acc_delta.mul_(rho).addcmul_(delta, delta, 1 - rho);
      param.add_(delta, -lr);
    }
  }
  return loss;
}

void Adadelta::save(torch::serialize::OutputArchive& archive) const {
  int64_t position = 0;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    torch::serialize::OutputArchive options;
    param_groups_[g].options().serialize(options);
    archive.write("group" + std::to_string(g), options);
    for (const auto& param : param_groups_[g].params()) {
      auto it = state_.find(param.unsafeGetTensorImpl());
      if (it != state_.end() && it->second) {
        const auto& state = static_cast<const AdadeltaParamState&>(*it->second);
        const std::string key = "param" + std::to_string(position);
        archive.write(key + ".square_avg", state.square_avg());
        archive.write(key + ".acc_delta", state.acc_delta());
      }
      ++position;
    }
  }
  archive.write("num_params", c10::IValue(position));
}

void Adadelta::load(torch::serialize::InputArchive& archive) {
  c10::IValue saved_count;
  archive.read("num_params", saved_count);
  int64_t position = 0;
  for (const auto& group : param_groups_) position += static_cast<int64_t>(group.params().size());
  if (saved_count.toInt() != position) {
    throw std::runtime_error("Adadelta::load: saved state has " +
                             std::to_string(saved_count.toInt()) + " parameters, optimizer has " +
                             std::to_string(position));
  }
  position = 0;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    torch::serialize::InputArchive options;
    archive.read("group" + std::to_string(g), options);
    param_groups_[g].options().serialize(options);
    for (const auto& param : param_groups_[g].params()) {
      const std::string key = "param" + std::to_string(position++);
      torch::Tensor square_avg, acc_delta;
      if (archive.try_read(key + ".square_avg", square_avg)) {
        archive.read(key + ".acc_delta", acc_delta);
        auto state = std::make_unique<AdadeltaParamState>();
        state->square_avg(square_avg);
        state->acc_delta(acc_delta);
        state_[param.unsafeGetTensorImpl()] = std::move(state);
      } else {
        state_.erase(param.unsafeGetTensorImpl());
      }
    }
  }
}

}  // namespace ddp

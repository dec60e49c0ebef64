#include <ddp/sync_batch_norm.h>

#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ddp {

namespace {

// Every dimension but the channels: [batch, channels, height, width].
const std::vector<int64_t> kReduceDims = {0, 2, 3};

std::string shape_string(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// A per-channel float64 vector as a [1, C, 1, 1] tensor of `like`'s dtype, to broadcast.
torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& like) {
  return v.to(like.scalar_type()).view({1, -1, 1, 1});
}

// Autograd context data must be IValues: the communicator travels to backward in a capsule.
struct CommunicatorCapsule : torch::CustomClassHolder {
  explicit CommunicatorCapsule(std::shared_ptr<Communicator> c) : comm(std::move(c)) {}
  std::shared_ptr<Communicator> comm;
};

struct GlobalStatistics {
  torch::Tensor mean, var;  // float64 [C]; var is biased (divides by count)
  int64_t count = 0;        // values per channel over all ranks
};

// Each rank reduces its own batch with ATen's Welford var_mean in the input's dtype and sends
// count * mean and count * (var + mean^2), in float64, plus its count: one all-reduce. The
// global variance E[x^2] - mean^2 then cancels in float64, which loses about
// 1e-16 * mean^2 / var relative: negligible against float32 data.
GlobalStatistics global_statistics(const torch::Tensor& input, Communicator& comm) {
  const int64_t channels = input.size(1);
  const int64_t count = input.numel() / channels;
  torch::Tensor packed = torch::zeros({2 * channels + 1}, input.options().dtype(torch::kDouble));
  if (count > 0) {
    const auto var_mean = torch::var_mean(input, at::IntArrayRef(kReduceDims), /*unbiased=*/false);
    const torch::Tensor var = std::get<0>(var_mean).to(torch::kDouble);
    const torch::Tensor mean = std::get<1>(var_mean).to(torch::kDouble);
    packed.slice(0, 0, channels).copy_(mean * static_cast<double>(count));
    packed.slice(0, channels, 2 * channels).copy_((var + mean * mean) * static_cast<double>(count));
    packed[2 * channels].fill_(static_cast<double>(count));
  }
  comm.all_reduce(packed);
  GlobalStatistics stats;
  stats.count = static_cast<int64_t>(packed[2 * channels].item<double>());
  if (stats.count <= 1) {
    // Every rank sees the same count, so every rank throws: none is left in a collective.
    throw std::invalid_argument(
        "ddp::BatchNorm2d (synchronised): expected more than 1 value per channel over all ranks "
        "when training, got " + std::to_string(stats.count) + " (rank " +
        std::to_string(comm.rank()) + " input " + shape_string(input) + ")");
  }
  const double n = static_cast<double>(stats.count);
  stats.mean = packed.slice(0, 0, channels) / n;
  stats.var = (packed.slice(0, channels, 2 * channels) / n - stats.mean * stats.mean).clamp_min(0);
  return stats;
}

// y = (x - mean) * invstd * weight + bias with global mean and invstd (inputs, not recomputed,
// so forward communicates once). Backward all-reduces sum(dy) and sum(dy * (x - mean)) per
// channel for the input gradient; the weight and bias gradients it returns are this rank's
// share, which the gradient averaging of data parallelism then combines like every other
// parameter's.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& mean, const torch::Tensor& invstd,
                               int64_t count, std::shared_ptr<Communicator> comm) {
    const torch::Tensor scale = invstd * weight.to(torch::kDouble);
    const torch::Tensor shift = bias.to(torch::kDouble) - mean * scale;
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["comm"] =
        c10::IValue::make_capsule(c10::make_intrusive<CommunicatorCapsule>(std::move(comm)));
    return torch::addcmul(per_channel(shift, input), input, per_channel(scale, input));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const torch::Tensor& dy = grad_outputs[0];
    const torch::Tensor xmu = input - per_channel(mean, input);
    const torch::Tensor sum_dy = dy.sum(kReduceDims).to(torch::kDouble);
    const torch::Tensor sum_dy_xmu = (dy * xmu).sum(kReduceDims).to(torch::kDouble);

    torch::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      const int64_t channels = input.size(1);
      torch::Tensor sums = torch::cat({sum_dy, sum_dy_xmu});
      auto capsule = c10::static_intrusive_pointer_cast<CommunicatorCapsule>(
          ctx->saved_data["comm"].toCapsule());
      capsule->comm->all_reduce(sums);
      const double n = static_cast<double>(ctx->saved_data["count"].toInt());
      const torch::Tensor mean_dy = sums.slice(0, 0, channels) / n;
      const torch::Tensor mean_dy_xmu = sums.slice(0, channels, 2 * channels) / n;
      // dx = weight * invstd * (dy - mean(dy) - (x - mean) * invstd^2 * mean(dy * (x - mean))),
      // every mean over all ranks.
      const torch::Tensor dy_scale = invstd * weight.to(torch::kDouble);
      const torch::Tensor xmu_scale = -dy_scale * invstd * invstd * mean_dy_xmu;
      grad_input = torch::addcmul(per_channel(-dy_scale * mean_dy, input), dy, per_channel(dy_scale, input))
                       .addcmul_(xmu, per_channel(xmu_scale, input));
    }
    if (ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    return {grad_input, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

BatchNorm2dImpl::BatchNorm2dImpl(const torch::nn::BatchNormOptions& options_) : options(options_) {
  reset();
}

// The registrations of torch::nn::BatchNorm2dImpl, in its order, so saved states match by name.
void BatchNorm2dImpl::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({c}));
    bias = register_parameter("bias", torch::zeros({c}));
  } else {
    weight = register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
}

void BatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "ddp::BatchNorm2d(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats()
         << ", synchronised=" << synchronised() << ")";
}

double BatchNorm2dImpl::running_average_factor() {
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  return factor;
}

torch::Tensor BatchNorm2dImpl::forward(const torch::Tensor& input) {
  if (input.dim() != 4) {
    throw std::invalid_argument("ddp::BatchNorm2d: expected 4D input [batch, channels, height, width], got " +
                                std::to_string(input.dim()) + "D input " + shape_string(input));
  }
  if (sync_comm_ && is_training()) return forward_synchronised(input);
  // torch::nn::BatchNorm2dImpl::forward, step for step.
  const double factor = running_average_factor();
  return torch::nn::functional::batch_norm(
      input, running_mean, running_var,
      torch::nn::functional::BatchNormFuncOptions()
          .weight(weight)
          .bias(bias)
          .training(is_training() || !options.track_running_stats())
          .momentum(factor)
          .eps(options.eps()));
}

torch::Tensor BatchNorm2dImpl::forward_synchronised(const torch::Tensor& input) {
  if (input.size(1) != options.num_features()) {
    throw std::invalid_argument("ddp::BatchNorm2d (synchronised): expected " +
                                std::to_string(options.num_features()) + " channels, got input " +
                                shape_string(input));
  }
  const GlobalStatistics stats = global_statistics(input.detach(), *sync_comm_);
  const double factor = running_average_factor();
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    // As PyTorch: the running variance is the unbiased estimate over the global batch.
    const double n = static_cast<double>(stats.count);
    const torch::Tensor unbiased_var = stats.var * (n / (n - 1));
    running_mean.copy_(running_mean.to(torch::kDouble) * (1 - factor) + stats.mean * factor);
    running_var.copy_(running_var.to(torch::kDouble) * (1 - factor) + unbiased_var * factor);
  }
  const torch::Tensor invstd = (stats.var + options.eps()).rsqrt();
  // LibTorch 1.13's custom functions reject undefined inputs: without affine parameters, the
  // identity ones (which need no gradient) stand in.
  const torch::Tensor w = weight.defined() ? weight : torch::ones({options.num_features()}, input.options());
  const torch::Tensor b = bias.defined() ? bias : torch::zeros({options.num_features()}, input.options());
  return SyncBatchNormFunction::apply(input, w, b, stats.mean, invstd, stats.count, sync_comm_);
}

int convert_sync_batchnorm(torch::nn::Module& module, std::shared_ptr<Communicator> comm) {
  if (!comm) throw std::invalid_argument("convert_sync_batchnorm: the communicator is null");
  // The root by reference, not through shared_from_this(), so a module on the stack works too.
  std::vector<std::pair<std::string, torch::nn::Module*>> all{{"", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    all.emplace_back(item.key(), item.value().get());
  }
  std::string refused;
  for (const auto& [name, m] : all) {
    if (m->as<torch::nn::BatchNorm1dImpl>() || m->as<torch::nn::BatchNorm2dImpl>() ||
        m->as<torch::nn::BatchNorm3dImpl>()) {
      refused += (refused.empty() ? "" : ", ") + (name.empty() ? "the root module" : name);
    }
  }
  if (!refused.empty()) {
    throw std::invalid_argument("convert_sync_batchnorm: torch::nn::BatchNorm layers cannot be synchronised (" +
                                refused + "): build the model with ddp::BatchNorm2d (ddp/batch_norm.h)");
  }
  // A module registered in two places is one layer.
  std::unordered_set<const torch::nn::Module*> converted;
  for (const auto& entry : all) {
    if (auto* bn = entry.second->as<BatchNorm2dImpl>()) {
      bn->set_sync_communicator(comm);
      converted.insert(bn);
    }
  }
  return static_cast<int>(converted.size());
}

}  // namespace ddp

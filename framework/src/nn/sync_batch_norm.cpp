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

// The statistics run over every dimension but the channels (dimension 1), whatever the rank.
std::vector<int64_t> reduce_dims(const torch::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel float64 vector as a [1, C, 1, ...] tensor of `like`'s rank and dtype, to
// broadcast against it.
torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& like) {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[1] = -1;
  return v.to(like.scalar_type()).view(shape);
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
// global variance E[x^2] - mean^2 then cancels in float64, negligible against float32 data.
// `module` names the layer in errors.
GlobalStatistics global_statistics(const torch::Tensor& input, Communicator& comm,
                                   const std::string& module) {
  const int64_t channels = input.size(1);
  const int64_t count = input.numel() / channels;
  torch::Tensor packed = torch::zeros({2 * channels + 1}, input.options().dtype(torch::kDouble));
  if (count > 0) {
    const auto var_mean = torch::var_mean(input, reduce_dims(input), /*unbiased=*/false);
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
    throw std::invalid_argument(module +
                                " (synchronised): expected more than 1 value per channel over all "
                                "ranks when training, got " +
                                std::to_string(stats.count) + " (rank " +
                                std::to_string(comm.rank()) + " input " + c10::str(input.sizes()) +
                                ")");
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
// parameter's. The same for every rank of input: reductions run over all dimensions but 1.
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
    const std::vector<int64_t> dims = reduce_dims(input);
    const torch::Tensor xmu = input - per_channel(mean, input);
    const torch::Tensor sum_dy = dy.sum(dims).to(torch::kDouble);
    const torch::Tensor sum_dy_xmu = (dy * xmu).sum(dims).to(torch::kDouble);

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
      grad_input =
          torch::addcmul(per_channel(-dy_scale * mean_dy, input), dy, per_channel(dy_scale, input))
              .addcmul_(xmu, per_channel(xmu_scale, input));
    }
    if (ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    return {grad_input,      grad_weight,     grad_bias,      torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// "ddp::BatchNorm2d": the module's name in errors and printouts (Module::name()).
std::string module_name(int64_t d) { return "ddp::BatchNorm" + std::to_string(d) + "d"; }

// The ranks of input torch::nn::BatchNormXd accepts, as words for errors.
std::string expected_input(int64_t d) {
  switch (d) {
    case 1:
      return "2D input [batch, channels] or 3D input [batch, channels, length]";
    case 2:
      return "4D input [batch, channels, height, width]";
    default:
      return "5D input [batch, channels, depth, height, width]";
  }
}

}  // namespace

template <int64_t D>
BatchNormImpl<D>::BatchNormImpl(const torch::nn::BatchNormOptions& options_)
    : torch::nn::Cloneable<BatchNormImpl<D>>(module_name(D)), options(options_) {
  reset();
}

// The registrations of torch::nn::BatchNormXd (NormImplBase::reset), in its order, so saved
// states match by name.
template <int64_t D>
void BatchNormImpl<D>::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = this->register_parameter("weight", torch::ones({c}));
    bias = this->register_parameter("bias", torch::zeros({c}));
  } else {
    weight = this->register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = this->register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = this->register_buffer("running_mean", torch::zeros({c}));
    running_var = this->register_buffer("running_var", torch::ones({c}));
    num_batches_tracked =
        this->register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
  } else {
    running_mean = this->register_buffer("running_mean", torch::Tensor());
    running_var = this->register_buffer("running_var", torch::Tensor());
    num_batches_tracked = this->register_buffer("num_batches_tracked", torch::Tensor());
  }
}

template <int64_t D>
void BatchNormImpl<D>::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << this->name() << "(" << options.num_features()
         << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats()
         << ", synchronised=" << synchronised() << ")";
}

template <int64_t D>
void BatchNormImpl<D>::check_input(const torch::Tensor& input) const {
  const bool rank_ok = D == 1 ? input.dim() == 2 || input.dim() == 3 : input.dim() == D + 2;
  if (!rank_ok) {
    throw std::invalid_argument(this->name() + ": expected " + expected_input(D) + ", got " +
                                std::to_string(input.dim()) + "D input " + c10::str(input.sizes()));
  }
  if (input.size(1) != options.num_features()) {
    throw std::invalid_argument(
        this->name() + ": expected " + std::to_string(options.num_features()) +
        " channels (num_features) in dimension 1, got input " + c10::str(input.sizes()));
  }
}

template <int64_t D>
double BatchNormImpl<D>::running_average_factor() {
  double factor = options.momentum().value_or(0.0);
  if (this->is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  return factor;
}

template <int64_t D>
torch::Tensor BatchNormImpl<D>::forward(const torch::Tensor& input) {
  check_input(input);
  if (sync_comm_ && this->is_training()) return forward_synchronised(input);
  // torch::nn::BatchNormImplBase::forward, step for step.
  const double factor = running_average_factor();
  return torch::nn::functional::batch_norm(
      input, running_mean, running_var,
      torch::nn::functional::BatchNormFuncOptions()
          .weight(weight)
          .bias(bias)
          .training(this->is_training() || !options.track_running_stats())
          .momentum(factor)
          .eps(options.eps()));
}

template <int64_t D>
torch::Tensor BatchNormImpl<D>::forward_synchronised(const torch::Tensor& input) {
  if (options.num_features() == 0) {
    // Every rank has the same layer, so every rank throws before the collective (PyTorch's
    // SyncBatchNorm refuses zero channels too).
    throw std::invalid_argument(this->name() + " (synchronised): num_features is 0");
  }
  const GlobalStatistics stats = global_statistics(input.detach(), *sync_comm_, this->name());
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
  // Custom autograd functions reject undefined inputs: without affine parameters, the
  // identity ones (which need no gradient) stand in.
  const torch::Tensor w =
      weight.defined() ? weight : torch::ones({options.num_features()}, input.options());
  const torch::Tensor b =
      bias.defined() ? bias : torch::zeros({options.num_features()}, input.options());
  return SyncBatchNormFunction::apply(input, w, b, stats.mean, invstd, stats.count, sync_comm_);
}

template class BatchNormImpl<1>;
template class BatchNormImpl<2>;
template class BatchNormImpl<3>;

namespace {

// For a torch::nn batch norm layer, "torch::nn::BatchNorm2d -> ddp::BatchNorm2d"; else empty.
std::string torch_batch_norm(torch::nn::Module& m) {
  int64_t d = 0;
  if (m.as<torch::nn::BatchNorm1dImpl>()) d = 1;
  if (m.as<torch::nn::BatchNorm2dImpl>()) d = 2;
  if (m.as<torch::nn::BatchNorm3dImpl>()) d = 3;
  if (d == 0) return "";
  const std::string suffix = std::to_string(d) + "d";
  return "torch::nn::BatchNorm" + suffix + " -> ddp::BatchNorm" + suffix;
}

// Synchronises `m` over `comm` if it is a ddp::BatchNorm<D>d; returns whether it is one.
template <int64_t D>
bool synchronise(torch::nn::Module& m, const std::shared_ptr<Communicator>& comm) {
  auto* bn = m.as<BatchNormImpl<D>>();
  if (bn) bn->set_sync_communicator(comm);
  return bn != nullptr;
}

}  // namespace

int convert_sync_batchnorm(torch::nn::Module& module, std::shared_ptr<Communicator> comm) {
  if (!comm) throw std::invalid_argument("convert_sync_batchnorm: the communicator is null");
  // The root by reference, not through shared_from_this(), so a module on the stack works too.
  std::vector<std::pair<std::string, torch::nn::Module*>> all{{"", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    all.emplace_back(item.key(), item.value().get());
  }
  std::string refused;
  for (const auto& [name, m] : all) {
    const std::string replacement = torch_batch_norm(*m);
    if (!replacement.empty()) {
      refused += (refused.empty() ? "" : ", ") + (name.empty() ? "the root module" : name) + " (" +
                 replacement + ")";
    }
  }
  if (!refused.empty()) {
    throw std::invalid_argument(
        "convert_sync_batchnorm: torch::nn batch norm layers cannot be synchronised in place: " +
        refused +
        "; build the model with the ddp layers named (<ddp/sync_batch_norm.h>: same options, "
        "parameters "
        "and buffers)");
  }
  // A module registered in two places is one layer.
  std::unordered_set<const torch::nn::Module*> converted;
  for (const auto& entry : all) {
    torch::nn::Module& m = *entry.second;
    if (synchronise<1>(m, comm) || synchronise<2>(m, comm) || synchronise<3>(m, comm))
      converted.insert(&m);
  }
  return static_cast<int>(converted.size());
}

}  // namespace ddp

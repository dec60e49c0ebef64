#include <ddp/train/grad_clip.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace ddp {

double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                      double norm_type, bool error_if_nonfinite) {
  if (std::isnan(max_norm) || max_norm < 0) {
    throw std::invalid_argument("clip_grad_norm: max_norm must be >= 0 (got " +
                                std::to_string(max_norm) + ")");
  }
  const bool infinity = norm_type == std::numeric_limits<double>::infinity();
  if (!infinity && !(norm_type >= 1 && std::isfinite(norm_type))) {
    throw std::invalid_argument("clip_grad_norm: norm_type must be >= 1 or infinity (got " +
                                std::to_string(norm_type) + ")");
  }
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;

  // As PyTorch's _get_total_norm: one norm per gradient, in its dtype, then the norm of those
  // on the first gradient's device.
  const torch::Device first = grads.front().device();
  std::vector<torch::Tensor> norms;
  norms.reserve(grads.size());
  for (const torch::Tensor& g : grads) {
    norms.push_back(torch::linalg_vector_norm(g.detach(), norm_type).to(first));
  }
  const torch::Tensor total = torch::linalg_vector_norm(torch::stack(norms), norm_type);
  const double total_value = total.item<double>();
  if (error_if_nonfinite && !std::isfinite(total_value)) {
    throw std::runtime_error("clip_grad_norm: the total norm of order " +
                             std::to_string(norm_type) + " of the gradients is " +
                             std::to_string(total_value) +
                             ", so they cannot be clipped (a NaN or infinite gradient)");
  }
  // As PyTorch's _clip_grads_with_norm_: multiplied even when the factor is 1, so a NaN total
  // turns the gradients into NaN exactly as there.
  const torch::Tensor factor = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  torch::NoGradGuard no_grad;
  for (torch::Tensor& g : grads) g.mul_(factor.to(g.device()));
  return total_value;
}

}  // namespace ddp

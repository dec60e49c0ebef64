#include <ddp/train/divergence.h>

#include <torch/torch.h>

#include <limits>

namespace ddp {

OnNonFinite parse_on_nonfinite(const std::string& name) {
  if (name == "stop") return OnNonFinite::Stop;
  if (name == "skip") return OnNonFinite::Skip;
  throw std::invalid_argument("'" + name + "' is not one of: stop, skip");
}

double largest_abs_gradient(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad().detach());
  }
  if (grads.empty()) return 0.0;
  torch::NoGradGuard no_grad;
  const torch::Device first = grads.front().device();
  std::vector<torch::Tensor> largest;
  if (first.is_cuda()) {
    // The infinity norm: a max of |g|, which propagates NaN; a fused kernel over all the
    // tensors, since on a GPU the launches are the cost.
    largest = at::_foreach_norm(grads, std::numeric_limits<double>::infinity());
  } else {
    // On the CPU the infinity norm is a slow, unvectorised pass; max(-min, max) from aminmax
    // is the same value in one vectorised pass, and propagates NaN too.
    for (const torch::Tensor& g : grads) {
      auto [lowest, highest] = at::aminmax(g);
      largest.push_back(at::maximum(lowest.neg(), highest));
    }
  }
  // One max in the gradients' own dtype where they share it (widening to double is exact and
  // keeps the order, so the result is the same), rather than a conversion kernel per tensor.
  bool alike = true;
  for (const torch::Tensor& l : largest) {
    alike = alike && l.device() == first && l.scalar_type() == largest.front().scalar_type();
  }
  if (!alike) {
    for (torch::Tensor& l : largest) l = l.to(first, torch::kDouble);
  }
  return torch::stack(largest).max().item<double>();
}

std::string first_nonfinite_tensor(const torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (const auto& named : {module.named_parameters(), module.named_buffers()}) {
    for (const auto& item : named) {
      const torch::Tensor& t = item.value();
      if (!t.defined() || !t.is_floating_point() || t.numel() == 0) continue;
      if (!torch::isfinite(t).all().item<bool>()) return item.key();
    }
  }
  return "";
}

}  // namespace ddp

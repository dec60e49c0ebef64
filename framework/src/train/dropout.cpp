#include <ddp/train/dropout.h>

#include <ddp/replicas.h>

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace ddp {

torch::Tensor dropout(const torch::Tensor& input, double p, bool training) {
  if (!(p >= 0 && p <= 1)) {
    throw std::invalid_argument("ddp::dropout: p must be in [0, 1] (got " + std::to_string(p) + ")");
  }
  if (!training || p == 0 || input.numel() == 0) return input;
  if (!input.device().is_cpu()) return torch::dropout(input, p, training);
  if (p == 1) return input * torch::zeros({}, input.options());
  // ATen's _dropout_impl for the CPU, with the generator named.
  torch::Tensor noise = torch::empty_like(input);
  {
    torch::NoGradGuard no_grad;
    noise.bernoulli_(1 - p, cpu_generator());
    noise.div_(1 - p);
  }
  return input * noise;
}

}  // namespace ddp

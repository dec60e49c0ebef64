#include <ddp/train/augment.h>

#include "util/host_to_device.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace ddp {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

at::Generator augmentation_generator(uint64_t seed, int rank, int64_t epoch) {
  // Chained rather than xor'ed together, so (rank 1, epoch 2) and (rank 2, epoch 1) differ. The
  // CPU generator keeps only the low 32 bits of its seed; splitmix64 mixes every input bit in.
  uint64_t mixed = splitmix64(seed);
  mixed = splitmix64(mixed ^ static_cast<uint64_t>(rank));
  mixed = splitmix64(mixed ^ static_cast<uint64_t>(epoch));
  return at::make_generator<at::CPUGeneratorImpl>(mixed);
}

torch::Tensor RandomCropFlip::operator()(const torch::Tensor& images,
                                         at::Generator& generator) const {
  if (images.dim() != 4) {
    throw std::invalid_argument("RandomCropFlip: images must be [B,C,H,W], got " +
                                std::to_string(images.dim()) + " dimensions");
  }
  if (padding < 0) {
    throw std::invalid_argument("RandomCropFlip: padding must be >= 0, got " +
                                std::to_string(padding));
  }
  if (!generator.device().is_cpu()) {
    throw std::invalid_argument(
        "RandomCropFlip: the generator must be a CPU generator, got one on " +
        generator.device().str());
  }
  const int64_t batch = images.size(0);
  const int64_t channels = images.size(1);
  const int64_t height = images.size(2);
  const int64_t width = images.size(3);

  // Every draw is made on the CPU, in this order, so a CPU and a GPU run augment alike.
  const auto options = torch::TensorOptions().dtype(torch::kLong);
  torch::Tensor top = torch::zeros({batch, 1}, options);
  torch::Tensor left = torch::zeros({batch, 1}, options);
  if (padding > 0) {
    top = torch::randint(0, 2 * padding + 1, {batch, 1}, generator, options);
    left = torch::randint(0, 2 * padding + 1, {batch, 1}, generator, options);
  }
  torch::Tensor rows = top + torch::arange(height, options);  // [B,H]: source row in the padding
  torch::Tensor cols = torch::arange(width, options).expand({batch, width});
  if (flip) {
    // As torchvision does it: crop first, then mirror the crop.
    const torch::Tensor mirrored =
        torch::randint(0, 2, {batch, 1}, generator, options).to(torch::kBool);
    cols = torch::where(mirrored, width - 1 - cols, cols);
  }
  cols = cols + left;  // [B,W]: source column in the padding

  // Two gathers, rows then columns, give every sample its own window without a loop over the
  // batch, on any device and for any dtype.
  const torch::Device device = images.device();
  const torch::Tensor padded =
      padding > 0 ? torch::constant_pad_nd(images, {padding, padding, padding, padding}, 0)
                  : images;
  // One copy of both index sets, without the host waiting for the GPU (util/host_to_device.h).
  const torch::Tensor both =
      detail::to_device_without_waiting(torch::cat({rows.reshape(-1), cols.reshape(-1)}), device);
  const torch::Tensor row_index = both.slice(0, 0, batch * height)
                                      .view({batch, 1, height, 1})
                                      .expand({batch, channels, height, padded.size(3)});
  const torch::Tensor col_index = both.slice(0, batch * height)
                                      .view({batch, 1, 1, width})
                                      .expand({batch, channels, height, width});
  return padded.gather(2, row_index).gather(3, col_index);
}

}  // namespace ddp

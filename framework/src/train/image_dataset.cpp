#include <ddp/train/image_dataset.h>

#include <ddp/config.h>
#if DDP_WITH_CUDA
#include "util/cuda_device.h"
#endif

#include <torch/torch.h>

#include <stdexcept>

namespace ddp {

ImageDataset ImageDataset::to(torch::Device device) const {
  return ImageDataset{images.to(device), labels.to(device), mean, stddev};
}

Batch ImageDataset::batch(const std::vector<int64_t>& indices, int64_t begin, int64_t end,
                          torch::Device device) const {
  Batch raw = gather(indices, begin, end, device);
  return Batch{normalise(raw.inputs), raw.targets};
}

Batch ImageDataset::gather(const std::vector<int64_t>& indices, int64_t begin, int64_t end,
                           torch::Device device) const {
  if (begin < 0 || end > static_cast<int64_t>(indices.size()) || begin >= end) {
    throw std::out_of_range("ImageDataset::batch: range [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") outside the " +
                            std::to_string(indices.size()) + " indices");
  }
  // Gather uint8 first (4x less to move); conversion happens where the batch lives.
  torch::Tensor index =
      torch::from_blob(const_cast<int64_t*>(indices.data()) + begin, {end - begin}, torch::kLong);
#if DDP_WITH_CUDA
  if (images.is_cpu() && device.is_cuda()) {
    return Batch{detail::gather_to_device_async(images, index, device),
                 detail::gather_to_device_async(labels, index, device)};
  }
  // A plain copy of the indices to the GPU would make the host wait for all the work queued
  // there, and the data phase would time the previous step.
  if (images.is_cuda()) index = detail::copy_to_device_async(index, images.device());
#endif
  index = index.to(images.device());
  return Batch{images.index_select(0, index).to(device), labels.index_select(0, index).to(device)};
}

torch::Tensor ImageDataset::normalise(const torch::Tensor& pixels) const {
  const int64_t channels = pixels.size(1);
  if (static_cast<int64_t>(mean.size()) != channels ||
      static_cast<int64_t>(stddev.size()) != channels) {
    throw std::invalid_argument("ImageDataset: mean/stddev need one value per channel (" +
                                std::to_string(channels) + ")");
  }
  auto options = torch::TensorOptions().dtype(torch::kDouble).device(pixels.device());
  torch::Tensor scale = torch::tensor(stddev, options).to(torch::kFloat);
  torch::Tensor shift = torch::tensor(mean, options).to(torch::kFloat);
  return pixels.to(torch::kFloat)
      .div_(255.0f)
      .sub_(shift.view({1, channels, 1, 1}))
      .div_(scale.view({1, channels, 1, 1}));
}

bool fits_on(torch::Device device, [[maybe_unused]] int64_t bytes, [[maybe_unused]] int rank) {
  if (device.is_cpu()) return true;
#if DDP_WITH_CUDA
  if (device.is_cuda()) return bytes <= detail::cuda_free_bytes(device.index(), rank) / 2;
#endif
  throw std::invalid_argument("fits_on: no memory query for device " + device.str() +
                              " in this build");
}

}  // namespace ddp

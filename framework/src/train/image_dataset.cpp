#include <ddp/train/image_dataset.h>

#include <ddp/config.h>
#if DDP_WITH_CUDA
#include "util/cuda_device.h"
#endif
#include "util/host_to_device.h"

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
#endif
  index = detail::to_device_without_waiting(index, images.device());
  return Batch{images.index_select(0, index).to(device), labels.index_select(0, index).to(device)};
}

torch::Tensor ImageDataset::normalise(const torch::Tensor& pixels) const {
  const int64_t channels = pixels.size(1);
  if (static_cast<int64_t>(mean.size()) != channels ||
      static_cast<int64_t>(stddev.size()) != channels) {
    throw std::invalid_argument("ImageDataset: mean/stddev need one value per channel (" +
                                std::to_string(channels) + ")");
  }
  // Made on the host (double to float rounds alike there and on a GPU) and copied without
  // waiting: this runs for every batch, inside the data phase.
  std::vector<double> values(stddev);
  values.insert(values.end(), mean.begin(), mean.end());
  const torch::Tensor constants = detail::to_device_without_waiting(
      torch::tensor(values, torch::kDouble).to(torch::kFloat), pixels.device());
  const torch::Tensor scale = constants.slice(0, 0, channels);
  const torch::Tensor shift = constants.slice(0, channels, 2 * channels);
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

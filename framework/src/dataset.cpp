#include <ddp/dataset.h>

#include <torch/torch.h>

#include <stdexcept>

namespace ddp {

ImageDataset ImageDataset::to(torch::Device device) const {
  return ImageDataset{images.to(device), labels.to(device), mean, stddev};
}

Batch ImageDataset::batch(const std::vector<int64_t>& indices, int64_t begin, int64_t end,
                          torch::Device device) const {
  if (begin < 0 || end > static_cast<int64_t>(indices.size()) || begin >= end) {
    throw std::out_of_range("ImageDataset::batch: range [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") outside the " +
                            std::to_string(indices.size()) + " indices");
  }
  const int64_t channels = images.size(1);
  if (static_cast<int64_t>(mean.size()) != channels ||
      static_cast<int64_t>(stddev.size()) != channels) {
    throw std::invalid_argument("ImageDataset: mean/stddev need one value per channel (" +
                                std::to_string(channels) + ")");
  }
  // Gather uint8 first (4x less to move), then convert and normalise where the batch lives.
  torch::Tensor index =
      torch::from_blob(const_cast<int64_t*>(indices.data()) + begin, {end - begin}, torch::kLong)
          .to(images.device());
  torch::Tensor pixels = images.index_select(0, index).to(device);
  torch::Tensor targets = labels.index_select(0, index).to(device);

  auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  torch::Tensor scale = torch::tensor(stddev, options.dtype(torch::kDouble)).to(torch::kFloat);
  torch::Tensor shift = torch::tensor(mean, options.dtype(torch::kDouble)).to(torch::kFloat);
  torch::Tensor inputs = pixels.to(torch::kFloat)
                             .div_(255.0f)
                             .sub_(shift.view({1, channels, 1, 1}))
                             .div_(scale.view({1, channels, 1, 1}));
  return Batch{inputs, targets};
}

}  // namespace ddp

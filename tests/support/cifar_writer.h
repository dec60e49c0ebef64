#pragma once
// write_cifar10_file: test data in CIFAR-10's binary format (test_cifar.cpp, make_cifar_data).

#include <ddp/checkpoint_file.h>

#include "train/cifar_format.h"

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ddp_test {

inline std::string cifar_shape_text(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

// Writes images uint8 [N,3,32,32] and labels int64 [N] (values 0..9, N >= 1) in the binary
// format, atomically (write_atomically). Throws std::invalid_argument naming the file for other
// shapes, dtypes or labels.
inline void write_cifar10_file(const std::string& path, const torch::Tensor& images,
                               const torch::Tensor& labels) {
  const std::string where = "write_cifar10_file(" + path + "): ";
  if (images.scalar_type() != torch::kByte || images.dim() != 4 ||
      images.size(1) != ddp::kCifarChannels || images.size(2) != ddp::kCifarSide ||
      images.size(3) != ddp::kCifarSide) {
    throw std::invalid_argument(where + "images must be uint8 [N,3,32,32], got " +
                                std::string(c10::toString(images.scalar_type())) + " " +
                                cifar_shape_text(images));
  }
  const int64_t count = images.size(0);
  if (labels.scalar_type() != torch::kLong || labels.dim() != 1 || labels.size(0) != count) {
    throw std::invalid_argument(
        where + "labels must be int64 [" + std::to_string(count) + "] to match the images, got " +
        std::string(c10::toString(labels.scalar_type())) + " " + cifar_shape_text(labels));
  }
  if (count == 0) throw std::invalid_argument(where + "no images (the reader refuses empty files)");
  const torch::Tensor cpu_labels = labels.cpu();
  const int64_t low = cpu_labels.min().item<int64_t>();
  const int64_t high = cpu_labels.max().item<int64_t>();
  if (low < 0 || high >= ddp::kCifarClasses) {
    throw std::invalid_argument(where + "labels must lie in 0..9, got " +
                                std::to_string(low < 0 ? low : high));
  }
  const torch::Tensor records = torch::cat({cpu_labels.to(torch::kByte).view({count, 1}),
                                            images.cpu().reshape({count, ddp::kCifarPixels})},
                                           1);
  ddp::write_atomically(path, records.data_ptr(), static_cast<std::size_t>(records.numel()));
}

}  // namespace ddp_test

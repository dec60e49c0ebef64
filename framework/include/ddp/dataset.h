#pragma once
// A labelled image set held whole in memory as uint8 pixels. Batches are gathered by index and
// normalised on the device the data lives on, so there is no per-sample loader to wait for.

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace ddp {

struct Batch {
  torch::Tensor inputs;   // float32 [B, C, H, W], normalised
  torch::Tensor targets;  // int64 [B]
};

struct ImageDataset {
  torch::Tensor images;        // uint8 [N, C, H, W]
  torch::Tensor labels;        // int64 [N]
  std::vector<double> mean;    // per channel, on the 0..1 scale
  std::vector<double> stddev;  // per channel

  int64_t size() const { return labels.size(0); }

  // A copy whose tensors live on `device` (whole data set on the GPU when it fits).
  ImageDataset to(torch::Device device) const;

  // Gathers indices[begin, end) into a normalised batch on `device`: gather() then normalise().
  Batch batch(const std::vector<int64_t>& indices, int64_t begin, int64_t end,
              torch::Device device) const;

  // Gathers indices[begin, end) as uint8 pixels (Batch::inputs) and labels on `device`, for
  // augmentation before normalisation, as torchvision orders its transforms.
  Batch gather(const std::vector<int64_t>& indices, int64_t begin, int64_t end,
               torch::Device device) const;

  // uint8 pixels [B,C,H,W] -> float32 (x/255 - mean) / stddev per channel, on their device.
  torch::Tensor normalise(const torch::Tensor& pixels) const;
};

}  // namespace ddp

#pragma once
/// \file
/// A labelled image set held whole in memory as uint8 pixels, on the training device when it fits
/// there (fits_on), else in host memory. Batches are gathered by index and normalised on the
/// training device, so there is no per-sample loader to wait for.

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace ddp {

/// A batch of samples and their labels, on one device (ImageDataset::batch; gather() leaves the
/// inputs as uint8 pixels).
struct Batch {
  torch::Tensor inputs;   ///< float32 [B, C, H, W], normalised
  torch::Tensor targets;  ///< int64 [B]
};

/// A whole image data set in memory (load_mnist, load_cifar10): raw pixels and labels, with the
/// normalisation constants applied when a batch is made.
struct ImageDataset {
  torch::Tensor images;        ///< uint8 [N, C, H, W]
  torch::Tensor labels;        ///< int64 [N]
  std::vector<double> mean;    ///< per channel, on the 0..1 scale
  std::vector<double> stddev;  ///< per channel

  int64_t size() const { return labels.size(0); }  ///< the number of samples, N

  /// Pixels and labels.
  int64_t bytes() const { return images.nbytes() + labels.nbytes(); }

  /// A copy whose tensors live on `device` (whole data set on the GPU when it fits).
  ImageDataset to(torch::Device device) const;

  /// Gathers indices[begin, end) into a normalised batch on `device`: gather() then normalise().
  Batch batch(const std::vector<int64_t>& indices, int64_t begin, int64_t end,
              torch::Device device) const;

  /// Gathers indices[begin, end) as uint8 pixels (Batch::inputs) and labels on `device`, for
  /// augmentation before normalisation, as torchvision orders its transforms. From host memory to
  /// a GPU, the rows are gathered into pinned memory and copied on a side stream: the host does
  /// not wait for the copy, nor for the GPU's queued work (cuda_device.h).
  Batch gather(const std::vector<int64_t>& indices, int64_t begin, int64_t end,
               torch::Device device) const;

  /// uint8 pixels [B,C,H,W] -> float32 (x/255 - mean) / stddev per channel, on their device.
  torch::Tensor normalise(const torch::Tensor& pixels) const;
};

/// Whether a data set of `bytes` belongs on `device` for training: on a GPU, when it takes at most
/// half of the memory free there now, which leaves the rest to the model, its activations and the
/// caching allocator; host memory always holds it (it was loaded there). `rank` names the caller
/// in errors; another kind of device is std::invalid_argument.
bool fits_on(torch::Device device, int64_t bytes, int rank);

}  // namespace ddp

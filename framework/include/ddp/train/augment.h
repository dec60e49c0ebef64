#pragma once
/// \file
/// Training-time augmentation of whole batches, on whatever device the batch lives on: the
/// standard CIFAR recipe (torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip()).
/// Every random draw comes from a CPU generator the caller seeds, so a run repeats exactly and
/// a CPU and a GPU run draw the same crops and flips.

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>

namespace ddp {

/// A CPU generator seeded from (seed, rank, epoch) through splitmix64: different on every rank
/// and epoch, the same on every run with the same seed.
at::Generator augmentation_generator(uint64_t seed, int rank, int64_t epoch);

/// torchvision's RandomCrop(size, padding) then RandomHorizontalFlip, as CIFAR-10 training uses
/// them, on a whole batch at once.
struct RandomCropFlip {
  int64_t padding = 4;  ///< zero padding on each side before the crop; 0: no crop
  bool flip = true;     ///< mirror left-right with probability 1/2

  /// images: [B,C,H,W] of any dtype (uint8 before normalisation, as torchvision does it). Each
  /// sample gets its own crop offset in [0, 2*padding] per axis and its own flip, applied as crop
  /// then mirror. `generator` must be a CPU generator; it gives B top offsets, then B left
  /// offsets (both only when padding > 0), then B flips (only when flip), each drawn with
  /// torch::randint. Returns a new tensor of the same shape, dtype and device. Throws
  /// std::invalid_argument for a batch that is not 4-D, padding < 0 or a non-CPU generator.
  torch::Tensor operator()(const torch::Tensor& images, at::Generator& generator) const;
};

}  // namespace ddp

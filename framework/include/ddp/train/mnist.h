#pragma once
/// \file
/// MNIST and Fashion-MNIST in the IDX format, plain or gzipped.

#include <ddp/train/image_dataset.h>

#include <torch/types.h>

#include <string>

namespace ddp {

/// Debian's dataset-fashion-mnist installs the real Fashion-MNIST here.
inline constexpr const char* kDefaultMnistDir = "/usr/share/datasets/fashion-mnist";

/// Reads one IDX file (`path`, or `path`.gz when only that exists) into a uint8 tensor shaped
/// by its header. Throws std::runtime_error naming the file: missing, unreadable (with the
/// system's reason: "Permission denied", ...), not a regular file, bad magic, not uint8, a header
/// promising more data than the file can hold (checked before anything is allocated: a plain
/// file must hold exactly that, a .gz file at most 1032 bytes per compressed byte), truncated,
/// or trailing bytes.
torch::Tensor read_idx(const std::string& path);

/// Which part of MNIST load_mnist reads: the train-* (60000) or the t10k-* (10000) files.
enum class MnistSplit { Train, Test };

/// Loads train-* or t10k-* images and labels from `dir` as [N,1,28,28] uint8 + int64 labels,
/// normalised with the seed scripts' MNIST constants (0.1307, 0.3081). Throws naming the files
/// when the set is empty, the images are not 28x28, image and label counts differ or a label is
/// outside 0..9.
ImageDataset load_mnist(const std::string& dir, MnistSplit split);

}  // namespace ddp

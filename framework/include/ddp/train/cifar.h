#pragma once
/// \file
/// CIFAR-10 in its binary format ("CIFAR-10 binary version"): data_batch_1.bin .. data_batch_5.bin
/// and test_batch.bin, each a sequence of 3073-byte records (1 label byte 0..9, then 1024 red,
/// 1024 green, 1024 blue pixels, row-major 32x32).

#include <ddp/train/image_dataset.h>

#include <torch/types.h>

#include <string>

namespace ddp {

/// Where scripts/download_cifar10.sh unpacks the archive, relative to the working directory.
inline constexpr const char* kDefaultCifar10Dir = "data/cifar-10-batches-bin";

/// Which part of CIFAR-10 load_cifar10 reads.
enum class CifarSplit { Train, Test };

/// Reads one binary file into images uint8 [N,3,32,32] and labels int64 [N], with CIFAR-10's
/// per-channel mean and standard deviation. Throws std::runtime_error naming the file when it is
/// missing, unreadable (with the system's reason: "Permission denied", ...), not a regular file,
/// empty, not a whole number of 3073-byte records (checked from its size before anything is
/// allocated), or holds a label > 9 (the message gives the record index and the label).
ImageDataset read_cifar10_file(const std::string& path);

/// Train: data_batch_1..5.bin concatenated in that order (50000 images); Test: test_batch.bin.
/// A missing file is an error naming it (and saying how to download the data set).
ImageDataset load_cifar10(const std::string& dir, CifarSplit split);

}  // namespace ddp

#include <ddp/train/cifar.h>

#include <ddp/runtime.h>

#include <ddp/checkpoint_file.h>

#include "train/cifar_format.h"

#include "util/file_error.h"

#include <torch/torch.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>

namespace ddp {

using detail::throw_file_error;

namespace {

constexpr int64_t kChannels = kCifarChannels;
constexpr int64_t kSide = kCifarSide;
constexpr int64_t kPixels = kCifarPixels;
constexpr int64_t kRecord = kCifarRecord;
constexpr int64_t kClasses = kCifarClasses;

std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

}  // namespace

ImageDataset read_cifar10_file(const std::string& path) {
  // stat, then open: "no such file" only when there is none, else the reason it cannot be read.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) throw_file_error(path, "no such file");
    throw_file_error(path, "cannot read", errno);
  }
  if (S_ISDIR(info.st_mode)) throw_file_error(path, "not a regular file: it is a directory");
  if (!S_ISREG(info.st_mode)) throw_file_error(path, "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_file_error(path, "cannot open", errno);
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  const int64_t count = cifar_record_count(size, path);  // before anything is allocated
  // Read straight into a tensor so the slices below copy out of memory the tensor owns.
  torch::Tensor records = torch::empty({count, kRecord}, torch::kByte);
  in.read(static_cast<char*>(records.data_ptr()), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) {
    throw_file_error(
        path, "read " + std::to_string(in.gcount()) + " of " + std::to_string(size) + " bytes" +
                  (in.bad() ? std::string(": ") + std::strerror(errno) : std::string()));
  }
  check_cifar_labels(records.data_ptr<uint8_t>(), count, path);
  // contiguous(), not reshape(): reshape would give a strided view that skips the label bytes.
  torch::Tensor images = records.slice(1, 1).contiguous().view({count, kChannels, kSide, kSide});
  torch::Tensor labels = records.select(1, 0).to(torch::kLong);
  return ImageDataset{images, labels, {0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}};
}

ImageDataset load_cifar10(const std::string& dir, CifarSplit split) {
  WatchedPhase phase("loading data (CIFAR-10 in " + dir + ")");  // a file system can stall
  std::vector<std::string> paths;
  if (split == CifarSplit::Train) {
    for (int i = 1; i <= 5; ++i) paths.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
  } else {
    paths.push_back(dir + "/test_batch.bin");
  }
  for (const auto& path : paths) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0 && errno == ENOENT) {
      throw_file_error(path, "no such file (scripts/download_cifar10.sh " + dir +
                                 " downloads CIFAR-10's binary version there)");
    }
  }
  std::vector<ImageDataset> parts;
  std::vector<torch::Tensor> images, labels;
  for (const auto& path : paths) {
    parts.push_back(read_cifar10_file(path));
    images.push_back(parts.back().images);
    labels.push_back(parts.back().labels);
  }
  if (parts.size() == 1) return parts.front();
  return ImageDataset{torch::cat(images), torch::cat(labels), parts.front().mean,
                      parts.front().stddev};
}

void write_cifar10_file(const std::string& path, const torch::Tensor& images,
                        const torch::Tensor& labels) {
  const std::string where = "write_cifar10_file(" + path + "): ";
  if (images.scalar_type() != torch::kByte || images.dim() != 4 || images.size(1) != kChannels ||
      images.size(2) != kSide || images.size(3) != kSide) {
    throw std::invalid_argument(where + "images must be uint8 [N,3,32,32], got " +
                                std::string(c10::toString(images.scalar_type())) + " " +
                                shape_of(images));
  }
  const int64_t count = images.size(0);
  if (labels.scalar_type() != torch::kLong || labels.dim() != 1 || labels.size(0) != count) {
    throw std::invalid_argument(
        where + "labels must be int64 [" + std::to_string(count) + "] to match the images, got " +
        std::string(c10::toString(labels.scalar_type())) + " " + shape_of(labels));
  }
  if (count == 0) throw std::invalid_argument(where + "no images (the reader refuses empty files)");
  const torch::Tensor cpu_labels = labels.cpu();
  const int64_t low = cpu_labels.min().item<int64_t>();
  const int64_t high = cpu_labels.max().item<int64_t>();
  if (low < 0 || high >= kClasses) {
    throw std::invalid_argument(where + "labels must lie in 0..9, got " +
                                std::to_string(low < 0 ? low : high));
  }
  const torch::Tensor records = torch::cat(
      {cpu_labels.to(torch::kByte).view({count, 1}), images.cpu().reshape({count, kPixels})}, 1);
  write_atomically(path, records.data_ptr(), static_cast<std::size_t>(records.numel()));
}

}  // namespace ddp

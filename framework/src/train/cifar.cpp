#include <ddp/train/cifar.h>

#include <ddp/runtime.h>

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

ImageDataset read_cifar10_file(const std::string& path) {
  // stat, then open: "no such file" only when there is none, else the reason it cannot be read.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) throw_file_error(path, "no such file");
    throw_file_error(path, "cannot read", errno);
  }
  if (const char* why = detail::not_regular(info.st_mode)) throw_file_error(path, why);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_file_error(path, "cannot open", errno);
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  const int64_t count = cifar_record_count(size, path);  // before anything is allocated
  // Read straight into a tensor so the slices below copy out of memory the tensor owns.
  torch::Tensor records = torch::empty({count, kCifarRecord}, torch::kByte);
  in.read(static_cast<char*>(records.data_ptr()), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) {
    throw_file_error(
        path, "read " + std::to_string(in.gcount()) + " of " + std::to_string(size) + " bytes" +
                  (in.bad() ? std::string(": ") + std::strerror(errno) : std::string()));
  }
  check_cifar_labels(records.data_ptr<uint8_t>(), count, path);
  // contiguous(), not reshape(): reshape would give a strided view that skips the label bytes.
  torch::Tensor images =
      records.slice(1, 1).contiguous().view({count, kCifarChannels, kCifarSide, kCifarSide});
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

}  // namespace ddp

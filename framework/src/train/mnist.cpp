#include <ddp/train/mnist.h>

#include <ddp/runtime.h>

#include "train/idx_format.h"

#include "util/file_error.h"

#include <torch/torch.h>
#include <zlib.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

using detail::throw_file_error;

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// Reads exactly `size` bytes unless the file ends first; returns how many were read.
size_t read_some(gzFile file, const std::string& path, void* buffer, size_t size) {
  size_t done = 0;
  while (done < size) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30));
    const int got = gzread(file, static_cast<char*>(buffer) + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      // Z_ERRNO: the read itself failed (EIO, EISDIR, ...), which errno tells.
      if (code == Z_ERRNO) throw_file_error(path, "cannot read", errno);
      throw_file_error(path, std::string("cannot decompress: ") + message);
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

// `path` itself, else `path`.gz. Existence is stat's answer: a file that exists but cannot be
// read is reported when it is opened, with the reason (permission denied, ...).
std::string resolve(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) return path;
  const int error = errno;
  if (::stat((path + ".gz").c_str(), &info) == 0) return path + ".gz";
  if (error == ENOENT) throw_file_error(path, "no such file (nor " + path + ".gz)");
  throw_file_error(path, std::strerror(error));
}

}  // namespace

torch::Tensor read_idx(const std::string& requested) {
  const std::string path = resolve(requested);
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever; the
  // fstat below then refuses it. Reads of a regular file ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw_file_error(path, "cannot open", errno);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    throw_file_error(path, "cannot read", error);
  }
  if (const char* why = detail::not_regular(info.st_mode)) {
    ::close(fd);
    throw_file_error(path, why);
  }
  const uint64_t file_bytes = static_cast<uint64_t>(info.st_size);
  unsigned char gzip_magic[2] = {0, 0};
  const bool compressed =
      ::pread(fd, gzip_magic, 2, 0) == 2 && gzip_magic[0] == 0x1f && gzip_magic[1] == 0x8b;
  // gzread reads plain files unchanged, so one path serves .gz and raw IDX.
  GzFile file(gzdopen(fd, "rb"));
  if (!file) {
    ::close(fd);
    throw_file_error(path, "cannot open: out of memory");
  }

  // The header, then its checks against the file's size, before the data is allocated.
  std::array<uint8_t, 20> head{};
  size_t got = read_some(file.get(), path, head.data(), 4);
  const size_t header_bytes = idx_header_bytes(head.data(), got, path);
  got += read_some(file.get(), path, head.data() + 4, header_bytes - 4);
  const IdxHeader header = parse_idx_header(head.data(), got, file_bytes, compressed, path);

  torch::Tensor data = torch::empty(header.shape, torch::kByte);
  const size_t count = static_cast<size_t>(header.data_bytes);
  got = read_some(file.get(), path, data.data_ptr(), count);
  if (got != count) {
    throw_file_error(path, "truncated: header promises " + std::to_string(count) +
                               " bytes of data, file has " + std::to_string(got));
  }
  uint8_t extra = 0;
  if (read_some(file.get(), path, &extra, 1) != 0) {
    throw_file_error(path,
                     "trailing bytes after the " + std::to_string(count) + " the header promises");
  }
  return data;
}

ImageDataset load_mnist(const std::string& dir, MnistSplit split) {
  const std::string prefix = dir + "/" + (split == MnistSplit::Train ? "train" : "t10k");
  WatchedPhase phase("loading data (" + prefix + "-*-ubyte)");  // a file system can stall
  const std::string images_path = resolve(prefix + "-images-idx3-ubyte");
  const std::string labels_path = resolve(prefix + "-labels-idx1-ubyte");
  torch::Tensor images = read_idx(images_path);
  torch::Tensor labels = read_idx(labels_path);
  if (images.dim() != 3) throw_file_error(images_path, "expected 3 dimensions (N, rows, cols)");
  if (labels.dim() != 1) throw_file_error(labels_path, "expected 1 dimension (N)");
  // The model's input size and an empty set are errors here, naming the file, rather than a
  // shape error in the first forward or an epoch that trains nothing and reports "0/0".
  if (images.size(1) != 28 || images.size(2) != 28) {
    throw_file_error(images_path, "images are " + std::to_string(images.size(1)) + "x" +
                                      std::to_string(images.size(2)) + ", MNIST's are 28x28");
  }
  if (images.size(0) == 0) throw_file_error(images_path, "no images: the data set is empty");
  if (images.size(0) != labels.size(0)) {
    throw std::runtime_error(images_path + " has " + std::to_string(images.size(0)) +
                             " images but " + labels_path + " has " +
                             std::to_string(labels.size(0)) + " labels");
  }
  if (labels.numel() > 0 && labels.max().item<int64_t>() > 9) {
    throw_file_error(labels_path,
                     "label " + std::to_string(labels.max().item<int64_t>()) + " outside 0..9");
  }
  return ImageDataset{images.unsqueeze(1), labels.to(torch::kLong), {0.1307}, {0.3081}};
}

}  // namespace ddp

#include <ddp/data/mnist.h>

#include <torch/torch.h>
#include <zlib.h>

#include <array>
#include <cstdint>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

namespace {

bool exists(const std::string& path) { return std::ifstream(path).good(); }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

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
      fail(path, std::string("cannot decompress: ") + gzerror(file, &code));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

// `path` itself, else `path`.gz.
std::string resolve(const std::string& path) {
  if (exists(path)) return path;
  if (exists(path + ".gz")) return path + ".gz";
  fail(path, "no such file (nor " + path + ".gz)");
}

}  // namespace

torch::Tensor read_idx(const std::string& requested) {
  const std::string path = resolve(requested);
  // gzread reads plain files unchanged, so one path serves .gz and raw IDX.
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) fail(path, "cannot open");

  std::array<uint8_t, 4> magic{};
  if (read_some(file.get(), path, magic.data(), 4) != 4) fail(path, "truncated IDX header");
  if (magic[0] != 0 || magic[1] != 0 || magic[3] < 1 || magic[3] > 4) {
    fail(path, "bad magic number (not an IDX file)");
  }
  if (magic[2] != 0x08) fail(path, "IDX element type is not unsigned byte (0x08)");

  const int ndims = magic[3];
  std::vector<int64_t> shape;
  int64_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    std::array<uint8_t, 4> be{};
    if (read_some(file.get(), path, be.data(), 4) != 4) fail(path, "truncated IDX header");
    const int64_t dim = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) |
                        (int64_t{be[2]} << 8) | int64_t{be[3]};
    shape.push_back(dim);
    count *= dim;
  }
  torch::Tensor data = torch::empty(shape, torch::kByte);
  const size_t got = read_some(file.get(), path, data.data_ptr(), static_cast<size_t>(count));
  if (got != static_cast<size_t>(count)) {
    fail(path, "truncated: header promises " + std::to_string(count) + " bytes of data, file has " +
                   std::to_string(got));
  }
  uint8_t extra = 0;
  if (read_some(file.get(), path, &extra, 1) != 0) {
    fail(path, "trailing bytes after the " + std::to_string(count) + " the header promises");
  }
  return data;
}

ImageDataset load_mnist(const std::string& dir, MnistSplit split) {
  const std::string prefix = dir + "/" + (split == MnistSplit::Train ? "train" : "t10k");
  const std::string images_path = resolve(prefix + "-images-idx3-ubyte");
  const std::string labels_path = resolve(prefix + "-labels-idx1-ubyte");
  torch::Tensor images = read_idx(images_path);
  torch::Tensor labels = read_idx(labels_path);
  if (images.dim() != 3) fail(images_path, "expected 3 dimensions (N, rows, cols)");
  if (labels.dim() != 1) fail(labels_path, "expected 1 dimension (N)");
  if (images.size(0) != labels.size(0)) {
    throw std::runtime_error(images_path + " has " + std::to_string(images.size(0)) +
                             " images but " + labels_path + " has " +
                             std::to_string(labels.size(0)) + " labels");
  }
  if (labels.numel() > 0 && labels.max().item<int64_t>() > 9) {
    fail(labels_path, "label " + std::to_string(labels.max().item<int64_t>()) + " outside 0..9");
  }
  return ImageDataset{images.unsqueeze(1), labels.to(torch::kLong), {0.1307}, {0.3081}};
}

}  // namespace ddp

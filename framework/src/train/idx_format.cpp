#include "train/idx_format.h"

#include "util/file_error.h"

#include <limits>
#include <stdexcept>

namespace ddp {

using detail::throw_file_error;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ",";
    s += std::to_string(shape[d]);
  }
  s += "]";
  return s;
}

}  // namespace

size_t idx_header_bytes(const uint8_t* bytes, size_t size, const std::string& path) {
  if (size < 4) throw_file_error(path, "truncated IDX header (" + std::to_string(size) + " bytes)");
  if (bytes[0] != 0 || bytes[1] != 0 || bytes[3] < 1 || bytes[3] > 4) {
    throw_file_error(path, "bad magic number (not an IDX file)");
  }
  if (bytes[2] != 0x08) throw_file_error(path, "IDX element type is not unsigned byte (0x08)");
  return 4 + 4 * static_cast<size_t>(bytes[3]);
}

IdxHeader parse_idx_header(const uint8_t* bytes, size_t size, uint64_t file_bytes, bool compressed,
                           const std::string& path) {
  IdxHeader header;
  header.header_bytes = idx_header_bytes(bytes, size, path);
  if (size < header.header_bytes) {
    throw_file_error(path, "truncated IDX header (" + std::to_string(size) + " of " +
                               std::to_string(header.header_bytes) + " bytes)");
  }
  const int dims = bytes[3];
  bool overflow = false;
  uint64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    const uint8_t* be = bytes + 4 + 4 * d;
    const uint64_t dim = (uint64_t{be[0]} << 24) | (uint64_t{be[1]} << 16) |
                         (uint64_t{be[2]} << 8) | uint64_t{be[3]};
    header.shape.push_back(static_cast<int64_t>(dim));
    // Four dimensions below 2^32 each can overflow 64 bits: saturate, then any bound refuses it.
    if (__builtin_mul_overflow(count, dim, &count)) overflow = true;
  }
  // A zero dimension makes the product 0 whatever overflowed before it.
  for (int64_t dim : header.shape) {
    if (dim == 0) overflow = false, count = 0;
  }
  const std::string promise =
      "the header promises " +
      (overflow ? "more than " + std::to_string(std::numeric_limits<uint64_t>::max())
                : std::to_string(count)) +
      " bytes of data (shape " + shape_text(header.shape) + ")";
  if (compressed) {
    // The bound itself may overflow for an absurd file size: then nothing real exceeds it.
    uint64_t bound = 0;
    const bool unbounded = __builtin_mul_overflow(file_bytes, kMaxDeflateRatio, &bound);
    if (overflow || (!unbounded && count > bound)) {
      throw_file_error(path, promise + ", more than its " + std::to_string(file_bytes) +
                                 " compressed bytes can hold (deflate expands at most " +
                                 std::to_string(kMaxDeflateRatio) + ":1)");
    }
  } else {
    const uint64_t after_header =
        file_bytes > header.header_bytes ? file_bytes - header.header_bytes : 0;
    if (overflow || count > after_header) {
      throw_file_error(path, "truncated: " + promise + ", the file has " +
                                 std::to_string(after_header) + " after its " +
                                 std::to_string(header.header_bytes) + "-byte header");
    }
    if (count < after_header) {
      throw_file_error(path, "trailing bytes: " + promise + ", the file has " +
                                 std::to_string(after_header) + " after its " +
                                 std::to_string(header.header_bytes) + "-byte header");
    }
  }
  header.data_bytes = count;
  return header;
}

}  // namespace ddp

#pragma once
// The IDX header (MNIST's file format) as a pure function on bytes, so that read_idx and the
// libFuzzer target (fuzz/fuzz_idx.cpp, built by clang without LibTorch) check the same code.
// A header is 4 magic bytes (0, 0, type 0x08 = uint8, number of dimensions 1..4), then one
// big-endian uint32 per dimension; the data follows, one byte per element.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

// Deflate expands at most 1032:1 (zlib's technical details, "Maximum compression factor"), so
// a gzip file of n bytes holds at most 1032 n bytes of data: the bound for a .gz header's
// promise, known before anything is decompressed.
inline constexpr uint64_t kMaxDeflateRatio = 1032;

struct IdxHeader {
  std::vector<int64_t> shape;
  uint64_t data_bytes = 0;  // the product of `shape`, one byte per element
  size_t header_bytes = 0;  // 4 + 4 * dimensions
};

// The header's length given its first 4 bytes (`size` >= 4): 4 + 4 * dimensions. Throws
// std::runtime_error naming `path` when they are not an IDX uint8 magic number.
size_t idx_header_bytes(const uint8_t* bytes, size_t size, const std::string& path);

// Parses the header at the start of `bytes` (`size` bytes: the header, or less when the file is
// shorter) of a file of `file_bytes` bytes, gzip-compressed when `compressed`, and checks that
// the data the header promises fits in the file before anything is allocated for it: exactly
// the bytes after the header of a plain file, at most kMaxDeflateRatio times a gzip file's
// size. The element count is computed without overflow. Throws std::runtime_error naming `path`
// and the fault.
IdxHeader parse_idx_header(const uint8_t* bytes, size_t size, uint64_t file_bytes, bool compressed,
                           const std::string& path);

}  // namespace ddp

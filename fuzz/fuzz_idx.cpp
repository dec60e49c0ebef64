// libFuzzer target: the IDX header checks read_idx runs before it allocates (data/idx_format.h).
// The input is a whole IDX file, as plain bytes and as if it were a gzip file of that size.
#include "train/idx_format.h"

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz.idx";
  for (bool compressed : {false, true}) {
    try {
      const ddp::IdxHeader header = ddp::parse_idx_header(data, size, size, compressed, path);
      // Accepted: what the reader then allocates is what the file can hold.
      if (!compressed && header.header_bytes + header.data_bytes != size) std::abort();
      if (compressed && header.data_bytes > uint64_t{size} * ddp::kMaxDeflateRatio) std::abort();
      uint64_t product = 1;
      for (int64_t dim : header.shape) product *= static_cast<uint64_t>(dim);
      if (product != header.data_bytes) std::abort();
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).rfind(path + ": ", 0) != 0) std::abort();  // names the file
    }
  }
  return 0;
}

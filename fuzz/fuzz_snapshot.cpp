// libFuzzer target: the snapshot checks load_snapshot runs before LibTorch reads the payload
// (train/snapshot_format.h): header against the file's size, checksum, and the progress record
// (the payload's first bytes as int64 values, at most 8 of them).
#include "train/snapshot_format.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz.pt";
  const char* bytes = reinterpret_cast<const char*>(data);
  auto names_the_file = [&](const std::runtime_error& e) {
    if (std::string(e.what()).rfind(path + ": ", 0) != 0) std::abort();
  };
  try {
    const ddp::SnapshotHeader header = ddp::parse_snapshot_header(bytes, size, size, path);
    if (header.payload_bytes + ddp::kSnapshotHeaderBytes != size) std::abort();
    ddp::check_snapshot_payload(header, bytes + ddp::kSnapshotHeaderBytes,
                                size - ddp::kSnapshotHeaderBytes, path);
  } catch (const std::runtime_error& e) {
    names_the_file(e);
  }
  int64_t values[8];
  const size_t count = std::min<size_t>(size / sizeof(int64_t), 8);
  std::memcpy(values, data, count * sizeof(int64_t));
  try {
    ddp::check_snapshot_progress(values, count, path);
    if (count < 4 || values[0] < 0 || values[1] < 0 || values[3] < 1) std::abort();
  } catch (const std::runtime_error& e) {
    names_the_file(e);
  }
  return 0;
}

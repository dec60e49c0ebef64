#include "train/snapshot_format.h"

#include "util/file_error.h"
#include "util/hash.h"

#include <cstring>
#include <stdexcept>

namespace ddp {

using detail::throw_file_error;

namespace {

uint64_t get_u64(const char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
}

}  // namespace

SnapshotHeader parse_snapshot_header(const char* bytes, size_t size, uint64_t file_bytes,
                                     const std::string& path) {
  if (size >= sizeof kSnapshotMagicV1 &&
      std::memcmp(bytes, kSnapshotMagicV1, sizeof kSnapshotMagicV1) == 0) {
    throw_file_error(
        path,
        "a snapshot of format 1 (DDPSNAP1, FNV-1a checksum), written by an older ddp; "
        "this one reads format 3 (DDPSNAP3, XXH64, with the position inside an epoch): "
        "start the run afresh, or resume with the ddp that wrote it");
  }
  if (size >= sizeof kSnapshotMagicV2 &&
      std::memcmp(bytes, kSnapshotMagicV2, sizeof kSnapshotMagicV2) == 0) {
    throw_file_error(
        path,
        "a snapshot of format 2 (DDPSNAP2, epoch ends only), written by an older ddp; "
        "this one reads format 3 (DDPSNAP3, with the position inside an epoch): start the "
        "run afresh, or resume with the ddp that wrote it");
  }
  // "DDPSNAP" and a later digit: a format this build does not know, written by a newer ddp. Said
  // so, with both versions, rather than "not a snapshot": the file is fine, the reader is old.
  constexpr size_t kPrefix = sizeof kSnapshotMagic - 1;
  const char version = size >= sizeof kSnapshotMagic ? bytes[kPrefix] : '\0';
  if (size >= sizeof kSnapshotMagic && std::memcmp(bytes, kSnapshotMagic, kPrefix) == 0 &&
      version > kSnapshotMagic[kPrefix] && version <= '9') {
    throw_file_error(
        path, std::string("a snapshot of format ") + version + " (DDPSNAP" + version +
                  "), written by a newer ddp; this build reads format " + kSnapshotMagic[kPrefix] +
                  " (DDPSNAP" + kSnapshotMagic[kPrefix] +
                  "): resume with the ddp that wrote it (or a newer one), or start the run afresh");
  }
  if (size < kSnapshotHeaderBytes || file_bytes < kSnapshotHeaderBytes ||
      std::memcmp(bytes, kSnapshotMagic, sizeof kSnapshotMagic) != 0) {
    throw_file_error(path, "not a ddp training snapshot (no DDPSNAP3 header; " +
                               std::to_string(file_bytes) + " bytes)");
  }
  SnapshotHeader header;
  header.payload_bytes = get_u64(bytes + sizeof kSnapshotMagic);
  header.payload_hash = get_u64(bytes + sizeof kSnapshotMagic + 8);
  if (file_bytes - kSnapshotHeaderBytes != header.payload_bytes) {
    throw_file_error(path, "truncated or padded: the header promises " +
                               std::to_string(header.payload_bytes) +
                               " bytes of payload, the file holds " +
                               std::to_string(file_bytes - kSnapshotHeaderBytes));
  }
  return header;
}

void check_snapshot_payload(const SnapshotHeader& header, const char* payload, size_t size,
                            const std::string& path) {
  if (size != header.payload_bytes || hash64(payload, size) != header.payload_hash) {
    throw_file_error(path, "corrupted: the payload's checksum does not match");
  }
}

void check_snapshot_progress(const int64_t* values, size_t count, const std::string& path) {
  if (count < 4) {
    throw_file_error(path, "unreadable snapshot: its progress record has " + std::to_string(count) +
                               " values, fewer than 4 (epoch, step, seed, world size)");
  }
  if (values[0] < 0 || values[1] < 0 || values[3] < 1 || values[3] > (int64_t{1} << 31) - 1) {
    throw_file_error(path, "unreadable snapshot: impossible progress (epoch " +
                               std::to_string(values[0]) + ", step " + std::to_string(values[1]) +
                               ", world size " + std::to_string(values[3]) + ")");
  }
  // Later values, when present: batches done, the per-rank batch size, the samples done.
  if ((count > 4 && values[4] < 0) || (count > 5 && values[5] < 0) ||
      (count > 6 && values[6] < -1)) {
    throw_file_error(
        path,
        "unreadable snapshot: impossible progress (batches done " + std::to_string(values[4]) +
            (count > 5 ? ", batch size " + std::to_string(values[5]) : std::string()) +
            (count > 6 ? ", samples done " + std::to_string(values[6]) : std::string()) + ")");
  }
}

}  // namespace ddp

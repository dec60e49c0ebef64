#pragma once
// The snapshot file's header (format 3: snapshot.h) and the checks of its values, as pure
// functions on bytes, so that load_snapshot and the libFuzzer target (fuzz/fuzz_snapshot.cpp,
// built without LibTorch) check the same code.

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

inline constexpr char kSnapshotMagic[8] = {'D', 'D', 'P', 'S', 'N', 'A', 'P', '3'};
// Older formats, refused with a message that names them.
inline constexpr char kSnapshotMagicV2[8] = {'D', 'D', 'P', 'S', 'N', 'A', 'P', '2'};
inline constexpr char kSnapshotMagicV1[8] = {'D', 'D', 'P', 'S', 'N', 'A', 'P', '1'};
inline constexpr size_t kSnapshotHeaderBytes = sizeof kSnapshotMagic + 2 * sizeof(uint64_t);

struct SnapshotHeader {
  uint64_t payload_bytes = 0;
  uint64_t payload_hash = 0;
};

// Parses the header from the first `size` bytes of a file of `file_bytes` bytes (`size` may be
// less than the header when the file is shorter) and checks that the payload it promises is
// exactly what follows it in the file: so a reader knows the size is right before it allocates
// the payload. Throws std::runtime_error naming `path` for format 1 or 2, a newer format
// ("DDPSNAP4": naming its version and this build's), another file, or a truncated or padded file.
SnapshotHeader parse_snapshot_header(const char* bytes, size_t size, uint64_t file_bytes,
                                     const std::string& path);

// The payload's checksum: throws naming `path` when XXH64 of the `size` bytes at `payload`
// is not `header.payload_hash`.
void check_snapshot_payload(const SnapshotHeader& header, const char* payload, size_t size,
                            const std::string& path);

// The progress record (epoch, global step, seed, world size, then whatever a later format
// adds: batches done, the per-rank batch size, the samples done) as `count` values: throws
// naming `path` unless there are at least 4, epoch and step are >= 0, the world size is in
// 1..2^31-1, and those later values that are there are >= 0 (the samples done >= -1).
void check_snapshot_progress(const int64_t* values, size_t count, const std::string& path);

}  // namespace ddp

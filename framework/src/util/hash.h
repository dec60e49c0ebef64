#pragma once
// Hashing: XXH64 from Debian's xxHash (libxxhash-dev), the library's one non-cryptographic hash:
// replica fingerprints, snapshot checksums, the identity of a rank's CPU set. It runs at memory
// speed (ResNet-18's 45 MB in milliseconds) and its values are stable across machines and
// releases (the snapshot format relies on that).

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

inline uint64_t hash64(const void* data, size_t size, uint64_t seed = 0) {
  return XXH64(data, size, seed);
}

// Appends the low `bytes` bytes of `value`, little-endian (the lengths and checksums that frame
// a snapshot file and a TensorBoard record).
inline void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace ddp

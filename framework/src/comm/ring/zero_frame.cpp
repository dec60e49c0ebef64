#include "comm/ring/zero_frame.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ddp::detail {

namespace {

constexpr std::uint64_t kBitmap = std::uint64_t{1} << 63;

std::size_t bitmap_bytes(std::size_t count) { return (count + 7) / 8; }

// Elements are compared and moved as unsigned integers of their size: bytes, not values.
template <class T>
T load(const char* p) {
  T x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

template <class T>
std::size_t count_nonzero(const char* data, std::size_t count) {
  std::size_t k = 0;
  for (std::size_t i = 0; i < count; ++i) k += load<T>(data + i * sizeof(T)) != 0;
  return k;
}

// Writes the bitmap, then the non-zero elements; `values` has room for one element more than
// there are non-zero ones (each element is written, and kept only if it is not zero).
template <class T>
void pack(const char* data, std::size_t count, unsigned char* bitmap, char* values) {
  std::size_t k = 0;
  for (std::size_t b = 0; b < count; b += 8) {
    unsigned bits = 0;
    const std::size_t end = std::min(count, b + 8);
    for (std::size_t i = b; i < end; ++i) {
      const T x = load<T>(data + i * sizeof(T));
      const bool kept = x != 0;
      std::memcpy(values + k * sizeof(T), &x, sizeof x);
      k += kept;
      bits |= unsigned(kept) << (i - b);
    }
    bitmap[b / 8] = static_cast<unsigned char>(bits);
  }
}

// `values` may be read one element past the last kept one (see unpack_frame's callers' padding):
// in a block with a bit set, each element is loaded and kept only where its bit is set, so that no
// branch depends on each element; a block of 8 zeros is one branch.
template <class T>
void unpack(const unsigned char* bitmap, const char* values, std::size_t count, char* data) {
  std::size_t k = 0;
  for (std::size_t b = 0; b < count; b += 8) {
    const unsigned bits = bitmap[b / 8];
    const std::size_t end = std::min(count, b + 8);
    if (bits == 0) {
      std::memset(data + b * sizeof(T), 0, (end - b) * sizeof(T));
      continue;
    }
    for (std::size_t i = b; i < end; ++i) {
      const unsigned kept = (bits >> (i - b)) & 1;
      const T x = load<T>(values + k * sizeof(T)) & (T(0) - T(kept));
      std::memcpy(data + i * sizeof(T), &x, sizeof x);
      k += kept;
    }
  }
}

// Calls f.template operator()<T>() with T the unsigned integer of `item` bytes; false when
// there is none.
template <class F>
bool by_item(std::size_t item, F&& f) {
  switch (item) {
    case 1:
      f.template operator()<std::uint8_t>();
      return true;
    case 2:
      f.template operator()<std::uint16_t>();
      return true;
    case 4:
      f.template operator()<std::uint32_t>();
      return true;
    case 8:
      f.template operator()<std::uint64_t>();
      return true;
    default:
      return false;
  }
}

[[noreturn]] void bad_frame(const std::string& what) {
  throw std::runtime_error("a frame that " + what +
                           " (the peer is out of step, or runs another version of ddp)");
}

}  // namespace

std::size_t payload_bytes(std::uint64_t header) {
  return static_cast<std::size_t>(header & ~kBitmap);
}

bool is_packed(std::uint64_t header) { return (header & kBitmap) != 0; }

Frame pack_frame(const void* data, std::size_t count, std::size_t item, std::vector<char>& packed) {
  const char* bytes = static_cast<const char*>(data);
  const std::size_t dense = count * item;
  std::size_t kept = count;
  const bool known = by_item(item, [&]<class T>() { kept = count_nonzero<T>(bytes, count); });
  const std::size_t packed_bytes = bitmap_bytes(count) + kept * item;
  if (!known || packed_bytes >= dense || packed_bytes > dense - dense / 8) return {dense, data};
  // One element more than the payload: pack() writes one past the last kept element.
  if (packed.size() < packed_bytes + item) packed.resize(packed_bytes + item);
  char* out = packed.data();
  by_item(item, [&]<class T>() {
    pack<T>(bytes, count, reinterpret_cast<unsigned char*>(out), out + bitmap_bytes(count));
  });
  return {packed_bytes | kBitmap, out};
}

void check_header(std::uint64_t header, std::size_t count, std::size_t item) {
  const std::size_t bytes = payload_bytes(header), dense = count * item;
  if (!is_packed(header) && bytes != dense) {
    bad_frame("holds " + std::to_string(bytes) + " bytes, not " + std::to_string(dense));
  }
  // A packed frame is shorter than the elements, and holds at least their bitmap.
  if (is_packed(header) && (bytes >= dense || bytes < bitmap_bytes(count))) {
    bad_frame("has a bitmap of " + std::to_string(bytes) + " bytes for " + std::to_string(dense));
  }
}

void unpack_frame(const char* payload, std::size_t bytes, std::size_t count, std::size_t item,
                  void* data) {
  const auto* bits = reinterpret_cast<const unsigned char*>(payload);
  const std::size_t map = bitmap_bytes(count);
  std::size_t kept = 0;
  if (bytes >= map) {
    for (std::size_t i = 0; i < map; ++i) kept += std::popcount(unsigned(bits[i]));
  }
  const bool unused_bits = count % 8 != 0 && bytes >= map && (bits[map - 1] >> (count % 8));
  if (bytes < map || unused_bits || bytes != map + kept * item) {
    bad_frame("has a bitmap that does not match its " + std::to_string(bytes) + " bytes");
  }
  char* out = static_cast<char*>(data);
  const bool known = by_item(item, [&]<class T>() { unpack<T>(bits, payload + map, count, out); });
  if (!known) bad_frame("has a bitmap for elements of " + std::to_string(item) + " bytes");
}

}  // namespace ddp::detail

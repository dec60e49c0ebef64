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

template <class T>
void unpack(const unsigned char* bitmap, const char* values, std::size_t count, char* data) {
  std::size_t k = 0;
  for (std::size_t i = 0; i < count; ++i) {
    T x = 0;
    if ((bitmap[i / 8] >> (i % 8)) & 1) std::memcpy(&x, values + sizeof(T) * k++, sizeof x);
    std::memcpy(data + i * sizeof(T), &x, sizeof x);
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
  throw std::runtime_error("socket ring: a frame from the previous rank " + what +
                           " (the peer is out of step or runs another ddp)");
}

}  // namespace

std::size_t pack_frame(const void* data, std::size_t count, std::size_t item,
                       std::vector<char>& frame) {
  const char* bytes = static_cast<const char*>(data);
  const std::size_t dense = count * item;
  std::size_t kept = count;
  const bool known = by_item(item, [&]<class T>() { kept = count_nonzero<T>(bytes, count); });
  const std::size_t packed = bitmap_bytes(count) + kept * item;
  const bool bitmap = known && count > 0 && packed <= dense - dense / 8;
  const std::size_t payload = bitmap ? packed : dense;
  // One element more than a packed payload needs: pack() writes one past the last kept element.
  if (frame.size() < kFrameHeaderBytes + payload + item) {
    frame.resize(kFrameHeaderBytes + payload + item);
  }
  const std::uint64_t header = payload | (bitmap ? kBitmap : 0);
  std::memcpy(frame.data(), &header, sizeof header);
  char* out = frame.data() + kFrameHeaderBytes;
  if (bitmap) {
    by_item(item, [&]<class T>() {
      pack<T>(bytes, count, reinterpret_cast<unsigned char*>(out), out + bitmap_bytes(count));
    });
  } else if (dense > 0) {
    std::memcpy(out, bytes, dense);
  }
  return kFrameHeaderBytes + payload;
}

std::size_t frame_bytes(const char* frame) {
  const auto header = load<std::uint64_t>(frame);
  return kFrameHeaderBytes + static_cast<std::size_t>(header & ~kBitmap);
}

void unpack_frame(const char* frame, std::size_t bytes, std::size_t count, std::size_t item,
                  void* data) {
  if (bytes < kFrameHeaderBytes || frame_bytes(frame) != bytes) bad_frame("has a broken header");
  const bool bitmap = (load<std::uint64_t>(frame) & kBitmap) != 0;
  const char* payload = frame + kFrameHeaderBytes;
  const std::size_t payload_bytes = bytes - kFrameHeaderBytes;
  char* out = static_cast<char*>(data);
  if (!bitmap) {
    if (payload_bytes != count * item) {
      bad_frame("holds " + std::to_string(payload_bytes) + " bytes, not " +
                std::to_string(count * item));
    }
    if (payload_bytes > 0) std::memcpy(out, payload, payload_bytes);
    return;
  }
  const auto* bits = reinterpret_cast<const unsigned char*>(payload);
  const std::size_t map = bitmap_bytes(count);
  std::size_t kept = 0;
  if (payload_bytes >= map) {
    for (std::size_t i = 0; i < map; ++i) kept += std::popcount(unsigned(bits[i]));
  }
  const bool unused_bits = count % 8 != 0 && payload_bytes >= map && (bits[map - 1] >> (count % 8));
  if (payload_bytes < map || unused_bits || payload_bytes != map + kept * item) {
    bad_frame("has a bitmap that does not match its " + std::to_string(payload_bytes) + " bytes");
  }
  const bool known = by_item(item, [&]<class T>() { unpack<T>(bits, payload + map, count, out); });
  if (!known) bad_frame("has a bitmap for elements of " + std::to_string(item) + " bytes");
}

}  // namespace ddp::detail

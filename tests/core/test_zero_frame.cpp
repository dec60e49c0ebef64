// The socket ring's frames (comm/ring/zero_frame.h): lossless, packed only where that is shorter,
// and a frame that does not hold what the receiver expects is an error, not a wrong result.
#include "comm/ring/zero_frame.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

namespace zero_frame_test {

using ddp::detail::check_header;
using ddp::detail::Frame;
using ddp::detail::is_packed;
using ddp::detail::pack_frame;
using ddp::detail::payload_bytes;
using ddp::detail::unpack_frame;

// What the receiver does with a frame (comm/ring/ring_connections.cpp): checks its header, then
// takes the payload as it is or unpacks it.
void receive(const Frame& frame, std::size_t count, std::size_t item, void* data) {
  check_header(frame.header, count, item);
  const char* payload = static_cast<const char*>(frame.payload);
  if (is_packed(frame.header)) {
    unpack_frame(payload, payload_bytes(frame.header), count, item, data);
  } else if (count > 0) {
    std::memcpy(data, payload, payload_bytes(frame.header));
  }
}

// `count` elements of `item` random bytes, each one all zero with probability `zeros`; the
// others keep at least one non-zero byte but may have zero bytes (as -0.0 and small ints do).
std::vector<char> elements(std::size_t count, std::size_t item, double zeros, unsigned seed) {
  std::mt19937 random(seed);
  std::bernoulli_distribution zero(zeros);
  std::uniform_int_distribution<int> byte(0, 255), position(0, int(item) - 1);
  std::vector<char> data(count * item);
  for (std::size_t i = 0; i < count; ++i) {
    char* e = data.data() + i * item;
    if (zero(random)) continue;
    for (std::size_t b = 0; b < item; ++b)
      e[b] = static_cast<char>(byte(random) & 1 ? byte(random) : 0);
    e[position(random)] = static_cast<char>(1 + byte(random) % 255);
  }
  return data;
}

std::size_t nonzero(const std::vector<char>& data, std::size_t item) {
  std::size_t k = 0;
  const std::vector<char> none(item, 0);
  for (std::size_t i = 0; i < data.size(); i += item)
    k += std::memcmp(&data[i], none.data(), item) != 0;
  return k;
}

TEST(ZeroFrame, GivesBackEveryByteAndPacksOnlyWhereShorter) {
  for (std::size_t item : {1, 2, 3, 4, 8}) {
    for (std::size_t count : {0, 1, 7, 8, 9, 1000, 4099}) {
      for (double zeros : {0.0, 0.05, 0.5, 0.95, 1.0}) {
        const std::vector<char> data = elements(count, item, zeros, unsigned(count * 31 + item));
        std::vector<char> packed_buffer;
        const Frame frame = pack_frame(data.data(), count, item, packed_buffer);
        const std::size_t dense = count * item;
        const std::size_t packed = (count + 7) / 8 + nonzero(data, item) * item;
        // Packed where that saves an eighth, for the element sizes that have an integer type;
        // else the elements themselves, not a copy.
        const bool expect_packed = item != 3 && packed < dense && packed <= dense - dense / 8;
        EXPECT_EQ(is_packed(frame.header), expect_packed);
        EXPECT_EQ(payload_bytes(frame.header), expect_packed ? packed : dense)
            << item << "-byte elements, " << count << ", " << zeros << " zeros";
        EXPECT_EQ(frame.payload, expect_packed ? static_cast<const void*>(packed_buffer.data())
                                               : static_cast<const void*>(data.data()));
        std::vector<char> back(dense + 1, 'x');
        receive(frame, count, item, back.data());
        EXPECT_EQ(std::vector<char>(back.begin(), back.begin() + dense), data)
            << item << "-byte elements, " << count << ", " << zeros << " zeros";
        EXPECT_EQ(back[dense], 'x') << "wrote past the elements";
      }
    }
  }
}

TEST(ZeroFrame, KeepsNegativeZeroAndNan) {
  const std::vector<float> values = {0.0f, -0.0f,  0.0f, std::nanf(""), 0.0f, 0.0f, 0.0f, 0.0f,
                                     0.0f, 1e-45f, 0.0f, 0.0f,          0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<char> packed;
  const Frame frame = pack_frame(values.data(), values.size(), sizeof(float), packed);
  EXPECT_TRUE(is_packed(frame.header));
  EXPECT_EQ(payload_bytes(frame.header), 2 + 3 * sizeof(float));  // 3 of 16 kept
  std::vector<float> back(values.size(), 7.0f);
  receive(frame, values.size(), sizeof(float), back.data());
  EXPECT_EQ(std::memcmp(back.data(), values.data(), values.size() * sizeof(float)), 0);
}

TEST(ZeroFrame, RefusesAFrameThatDoesNotHoldWhatIsExpected) {
  const std::vector<std::uint32_t> sparse = {0, 5, 0, 0, 0, 0, 0, 0, 0, 9};  // packed
  const std::vector<std::uint32_t> dense = {1, 2, 3};
  std::vector<char> buffer, unused;
  const Frame a = pack_frame(sparse.data(), sparse.size(), 4, buffer);
  const Frame b = pack_frame(dense.data(), dense.size(), 4, unused);
  ASSERT_TRUE(is_packed(a.header));
  ASSERT_FALSE(is_packed(b.header));
  std::vector<std::uint32_t> out(32);
  auto refused = [&](const auto& call) {
    try {
      call();
    } catch (const std::runtime_error& e) {
      return std::string(e.what()).find("out of step") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused([&] { check_header(b.header, 4, 4); })) << "dense, another element count";
  EXPECT_TRUE(refused([&] { check_header(a.header, 2, 4); })) << "packed, longer than dense";
  EXPECT_TRUE(refused([&] { check_header(a.header, 200, 4); })) << "shorter than its bitmap";
  const char* payload = static_cast<const char*>(a.payload);
  const std::size_t bytes = payload_bytes(a.header);
  EXPECT_TRUE(refused([&] { unpack_frame(payload, bytes, 17, 4, out.data()); }))
      << "a bitmap for more elements";
  EXPECT_TRUE(refused([&] { unpack_frame(payload, bytes - 1, 10, 4, out.data()); }))
      << "a payload cut short";
  std::vector<char> extra_bit(payload, payload + bytes);
  extra_bit[1] |= 0x80;  // element 15 of 10
  EXPECT_TRUE(refused([&] { unpack_frame(extra_bit.data(), bytes, 10, 4, out.data()); }))
      << "a bit past the last element";
  std::vector<char> lost_bit(payload, payload + bytes);
  lost_bit[0] = 0;  // element 1's bit gone: one value too many
  EXPECT_TRUE(refused([&] { unpack_frame(lost_bit.data(), bytes, 10, 4, out.data()); }))
      << "more values than bits";
  EXPECT_NO_THROW(check_header(a.header, sparse.size(), 4));
  EXPECT_NO_THROW(unpack_frame(payload, bytes, sparse.size(), 4, out.data()));
  EXPECT_EQ(std::vector<std::uint32_t>(out.begin(), out.begin() + 10), sparse);
}

}  // namespace zero_frame_test

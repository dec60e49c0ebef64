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

using ddp::detail::frame_bytes;
using ddp::detail::kFrameHeaderBytes;
using ddp::detail::pack_frame;
using ddp::detail::unpack_frame;

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
        std::vector<char> frame;
        const std::size_t size = pack_frame(data.data(), count, item, frame);
        ASSERT_GE(frame.size(), size);
        EXPECT_EQ(frame_bytes(frame.data()), size);
        const std::size_t dense = count * item;
        const std::size_t packed = (count + 7) / 8 + nonzero(data, item) * item;
        // Packed where that saves an eighth, for the element sizes that have an integer type.
        const bool expect_packed = item != 3 && count > 0 && packed <= dense - dense / 8;
        EXPECT_EQ(size, kFrameHeaderBytes + (expect_packed ? packed : dense))
            << item << "-byte elements, " << count << ", " << zeros << " zeros";
        std::vector<char> back(dense + 1, 'x');
        unpack_frame(frame.data(), size, count, item, back.data());
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
  std::vector<char> frame;
  const std::size_t size = pack_frame(values.data(), values.size(), sizeof(float), frame);
  EXPECT_EQ(size, kFrameHeaderBytes + 2 + 3 * sizeof(float));  // packed: 3 of 16 kept
  std::vector<float> back(values.size(), 7.0f);
  unpack_frame(frame.data(), size, values.size(), sizeof(float), back.data());
  EXPECT_EQ(std::memcmp(back.data(), values.data(), values.size() * sizeof(float)), 0);
}

TEST(ZeroFrame, RefusesAFrameThatDoesNotHoldWhatIsExpected) {
  const std::vector<std::uint32_t> sparse = {0, 5, 0, 0, 0, 0, 0, 0, 0, 9};  // packed
  const std::vector<std::uint32_t> dense = {1, 2, 3};
  std::vector<char> a, b;
  const std::size_t packed = pack_frame(sparse.data(), sparse.size(), 4, a);
  const std::size_t whole = pack_frame(dense.data(), dense.size(), 4, b);
  std::vector<std::uint32_t> out(32);
  auto refused = [&](const std::vector<char>& frame, std::size_t size, std::size_t count) {
    try {
      unpack_frame(frame.data(), size, count, 4, out.data());
    } catch (const std::runtime_error& e) {
      return std::string(e.what()).find("out of step") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused(b, whole, 4)) << "a dense frame of another element count";
  EXPECT_TRUE(refused(a, packed, 17)) << "a bitmap for more elements";
  EXPECT_TRUE(refused(a, packed - 1, 10)) << "a frame cut short";
  std::vector<char> extra_bit = a;
  extra_bit[kFrameHeaderBytes + 1] |= 0x80;  // element 15 of 10
  EXPECT_TRUE(refused(extra_bit, packed, 10)) << "a bit past the last element";
  std::vector<char> lost_bit = a;
  lost_bit[kFrameHeaderBytes] = 0;  // element 1's bit gone: one value too many
  EXPECT_TRUE(refused(lost_bit, packed, 10)) << "more values than bits";
  EXPECT_NO_THROW(unpack_frame(a.data(), packed, sparse.size(), 4, out.data()));
  EXPECT_EQ(std::vector<std::uint32_t>(out.begin(), out.begin() + 10), sparse);
}

}  // namespace zero_frame_test

#pragma once
// What the socket ring puts on the wire for a segment (internal): a frame that holds the segment
// either as it is, or, where that is shorter, as a bitmap of its non-zero elements followed by
// those elements alone.
//
// Why: the gradients of ReLU networks hold many exact zeros (units dead for the whole batch,
// inputs that are zero in every sample), and on a slow link the bytes are the step's time.
// PyTorch's gloo sends them all. This is lossless, so no result changes: an element is zero when
// every one of its bytes is (so -0.0 and NaN travel as they are), and the receiver gets back the
// bytes that were sent.
//
// The frame: a 64-bit header in the host's byte order (the ring's hosts share one, as MPI's
// datatypes assume), whose low 63 bits count the payload's bytes and whose top bit says
// "bitmap"; then the payload. The bitmap has one bit per element, element i in bit i % 8 of
// byte i / 8, set when the element is not zero. A frame is sent packed when that saves at least
// an eighth of its bytes: below that, the scan on both sides costs more than the bytes saved on
// a fast link.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp::detail {

inline constexpr std::size_t kFrameHeaderBytes = sizeof(std::uint64_t);

// The payload's size and form, from a frame's header.
std::size_t payload_bytes(std::uint64_t header);
bool is_packed(std::uint64_t header);

// A frame to send: its header, then payload_bytes(header) bytes at `payload`.
struct Frame {
  std::uint64_t header = 0;
  const void* payload = nullptr;
};

// The frame of `count` elements of `item` bytes each (1, 2, 4 or 8; other sizes are sent as they
// are) at `data`: its payload is `data` itself when sent as it is (no copy), else their packed
// form, written to `packed` (grown if needed). Both must outlive the frame's sending.
Frame pack_frame(const void* data, std::size_t count, std::size_t item, std::vector<char>& packed);

// The frame of `bytes` at `data` as they are.
inline Frame unpacked_frame(const void* data, std::size_t bytes) { return {bytes, data}; }

// Throws std::runtime_error when a frame with `header` cannot hold `count` elements of `item`
// bytes: the peer is out of step, or not a ddp ring of this version.
void check_header(std::uint64_t header, std::size_t count, std::size_t item);

// Writes the `count` elements of `item` bytes that a packed payload of `bytes` bytes holds to
// `data`; throws as check_header() when it does not hold exactly that many. `payload` must be
// readable for `item` bytes past its end (pack_frame's buffer is): elements are loaded whether
// kept or not, so that no branch depends on each element.
void unpack_frame(const char* payload, std::size_t bytes, std::size_t count, std::size_t item,
                  void* data);

}  // namespace ddp::detail

#pragma once
// Which gradients share a bucket: a pure function of the parameters' sizes and dtypes, the caps
// and the order the gradients are expected in (c10d's compute_bucket_assignment_by_size, with
// one difference, below). Unit-tested without MPI (tests/core/test_bucketing.cpp).

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <vector>

namespace ddp {

struct BucketCaps {
  double first_bytes;  // the first bucket closes before it would exceed this
  double cap_bytes;    // every later bucket likewise
};

// Both caps 0: every bucket holds one parameter (as any cap below every parameter's size does).
constexpr BucketCaps kOneParameterPerBucket{0, 0};

struct ParameterSize {
  size_t bytes;
  c10::ScalarType dtype;
};

// Groups the parameters named by `order` (indices into `params`), in that order, into buckets:
// a bucket holds one dtype and closes before it would exceed its cap; a parameter larger than
// the cap gets a bucket of its own. Unlike PyTorch, a parameter of at least caps.first_bytes
// also closes its bucket: it is worth an all-reduce of its own, and sharing a bucket with the
// gradients after it would hold its all-reduce back until they exist (the seed CNN's fc1.weight
// would wait for every convolution). Returns the buckets, each in `order`'s order.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<ParameterSize>& params,
                                                const std::vector<size_t>& order, BucketCaps caps);

}  // namespace ddp

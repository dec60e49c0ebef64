// Bucket assignment (parallel/bucketing.h): a pure function, checked here without MPI.
#include "parallel/bucketing.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

using Buckets = std::vector<std::vector<size_t>>;
using ddp::BucketCaps;
using ddp::ParameterSize;

std::vector<ParameterSize> floats(const std::vector<size_t>& bytes) {
  std::vector<ParameterSize> params;
  for (size_t b : bytes) params.push_back({b, c10::ScalarType::Float});
  return params;
}

TEST(Bucketing, FirstBucketSmallLaterOnesUpToTheCap) {
  // Reverse registration order, as the reducer starts: 3, 2, 1, 0.
  const auto params = floats({400, 400, 400, 100});
  EXPECT_EQ(ddp::assign_buckets(params, {3, 2, 1, 0}, BucketCaps{500, 1000}),
            (Buckets{{3, 2}, {1, 0}}));
  EXPECT_EQ(ddp::assign_buckets(params, {3, 2, 1, 0}, BucketCaps{499, 1200}),
            (Buckets{{3}, {2, 1, 0}}));
}

TEST(Bucketing, ABucketClosesBeforeItWouldExceedItsCap) {
  const auto params = floats({300, 300, 300, 300});
  EXPECT_EQ(ddp::assign_buckets(params, {0, 1, 2, 3}, BucketCaps{600, 600}),
            (Buckets{{0, 1}, {2, 3}}));
  EXPECT_EQ(ddp::assign_buckets(params, {0, 1, 2, 3}, BucketCaps{599, 599}),
            (Buckets{{0}, {1}, {2}, {3}}));
}

TEST(Bucketing, ALargeParameterGetsABucketOfItsOwn) {
  // Parameter 2 (2000 bytes) is at least the first cap: it closes its bucket, so its all-reduce
  // does not wait for the gradients after it, though the cap (5000) would take them.
  const auto params = floats({200, 10, 2000, 10, 10});
  EXPECT_EQ(ddp::assign_buckets(params, {0, 1, 2, 3, 4}, BucketCaps{100, 5000}),
            (Buckets{{0}, {1, 2}, {3, 4}}));
  // Larger than the cap: alone.
  EXPECT_EQ(ddp::assign_buckets(params, {0, 1, 2, 3, 4}, BucketCaps{100, 1000}),
            (Buckets{{0}, {1}, {2}, {3, 4}}));
}

TEST(Bucketing, DtypesNeverShareABucket) {
  std::vector<ParameterSize> params = floats({8, 8, 8});
  params[1].dtype = c10::ScalarType::Double;
  EXPECT_EQ(ddp::assign_buckets(params, {0, 1, 2}, BucketCaps{1e6, 1e6}), (Buckets{{0}, {1}, {2}}));
}

TEST(Bucketing, PerParameterIsThePolicyWithZeroCaps) {
  const auto params = floats({4, 0, 4096, 4});
  EXPECT_EQ(ddp::assign_buckets(params, {3, 2, 1, 0}, ddp::kOneParameterPerBucket),
            (Buckets{{3}, {2}, {1}, {0}}));
}

TEST(Bucketing, OnlyTheParametersInTheOrderAreAssigned) {
  // Frozen parameters (not in `order`) get no bucket; the order given is kept.
  const auto params = floats({4, 4, 4, 4});
  EXPECT_EQ(ddp::assign_buckets(params, {2, 0}, BucketCaps{1e6, 1e6}), (Buckets{{2, 0}}));
  EXPECT_EQ(ddp::assign_buckets(params, {}, BucketCaps{1e6, 1e6}), Buckets{});
}

}  // namespace

#include <ddp/data/distributed_sampler.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace {

TEST(DistributedSampler, MatchesPyTorchOverGrid) {
  const std::string reference =
      ddp_test::run_command(std::string(DDP_PYTHON) + " " + DDP_TEST_DIR + "/reference/sampler.py");
  std::istringstream lines(reference);
  int checked = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    int64_t size, replicas, rank, shuffle, seed, epoch, drop_last;
    std::string colon;
    in >> size >> replicas >> rank >> shuffle >> seed >> epoch >> drop_last >> colon;
    ASSERT_EQ(colon, ":") << line.substr(0, 80);
    std::vector<int64_t> expected;
    for (int64_t i; in >> i;) expected.push_back(i);

    ddp::DistributedSampler sampler(size, replicas, rank, shuffle != 0, seed, drop_last != 0);
    sampler.set_epoch(epoch);
    const std::vector<int64_t> actual = sampler.indices();
    ASSERT_EQ(actual, expected) << "size " << size << " replicas " << replicas << " rank " << rank
                                << " shuffle " << shuffle << " seed " << seed << " epoch " << epoch
                                << " drop_last " << drop_last;
    ASSERT_EQ(sampler.num_samples(), static_cast<int64_t>(expected.size()));
    ++checked;
  }
  EXPECT_GT(checked, 3000) << "the reference produced too few cases";
}

TEST(DistributedSampler, ShardsCoverTheDataSetWithPadding) {
  const int64_t size = 10, replicas = 4;
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < replicas; ++r) {
    ddp::DistributedSampler s(size, replicas, r, true, 7);
    for (int64_t i : s.indices()) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 12u);  // padded to 3 per rank
  for (int64_t i = 0; i < size; ++i) EXPECT_GE(seen.count(i), 1u) << i;
}

TEST(DistributedSampler, EpochChangesTheOrderSeedKeepsIt) {
  ddp::DistributedSampler a(100, 2, 0, true, 5), b(100, 2, 0, true, 5);
  EXPECT_EQ(a.indices(), b.indices());
  b.set_epoch(1);
  EXPECT_NE(a.indices(), b.indices());
}

TEST(DistributedSampler, RejectsBadArgumentsNamingThem) {
  try {
    ddp::DistributedSampler(10, 2, 2);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("invalid rank 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ddp::DistributedSampler(10, 0, 0), std::invalid_argument);
  EXPECT_THROW(ddp::DistributedSampler(-1, 1, 0), std::invalid_argument);
}

TEST(EvaluationShard, EveryIndexExactlyOnce) {
  for (int64_t replicas : {1, 2, 3, 4, 7}) {
    std::vector<int64_t> all;
    for (int64_t r = 0; r < replicas; ++r) {
      const auto shard = ddp::evaluation_shard(10001, replicas, r);
      all.insert(all.end(), shard.begin(), shard.end());
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), 10001u) << replicas;
    for (int64_t i = 0; i < 10001; ++i) ASSERT_EQ(all[i], i);
  }
}

}  // namespace

#include <ddp/distributed_sampler.h>
#include <ddp/train/step_boundary.h>

#include "test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <map>
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

// len(DataLoader(dataset, batch_size, sampler=DistributedSampler(...))) without drop_last: the
// padded shard's batches, the last one short; in a resumed epoch, of the rest (set_epoch's start).
TEST(DistributedSampler, NumBatchesIsTheLoadersLength) {
  ddp::DistributedSampler s(10, 4, 3);  // 3 samples per rank (padded)
  EXPECT_EQ(s.num_batches(1), 3);
  EXPECT_EQ(s.num_batches(2), 2);
  EXPECT_EQ(s.num_batches(3), 1);
  EXPECT_EQ(s.num_batches(64), 1);
  s.set_epoch(0, 6);  // 4 samples left: 1 per rank
  EXPECT_EQ(s.num_batches(2), 1);
  EXPECT_THROW(s.num_batches(0), std::invalid_argument);
}

// The one epoch length of the Trainer, its schedules and a hand-written loop.
TEST(EpochLength, LimitsTheBatchesThenGroupsThemIntoSteps) {
  EXPECT_EQ(ddp::epoch_length(10).batches, 10);
  EXPECT_EQ(ddp::epoch_length(10).steps, 10);
  EXPECT_EQ(ddp::epoch_length(10, 4).batches, 4);  // --limit-train-batches 4
  EXPECT_EQ(ddp::epoch_length(10, 40).batches, 10);
  EXPECT_EQ(ddp::epoch_length(10, 0, 3).steps, 4);  // 3 + 3 + 3 + 1
  EXPECT_EQ(ddp::epoch_length(10, 4, 3).steps, 2);
  EXPECT_EQ(ddp::epoch_length(0, 0, 2).steps, 0);
  EXPECT_THROW(ddp::epoch_length(-1), std::invalid_argument);
  EXPECT_THROW(ddp::epoch_length(1, -1), std::invalid_argument);
  EXPECT_THROW(ddp::epoch_length(1, 0, 0), std::invalid_argument);
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

// An epoch trained k batches of B on N ranks, then continued at M ranks from the positions
// trained (set_epoch's start): every index of the epoch is trained exactly once, padding aside.
// Returns how often each index was trained over both parts; `padding` gets the repeats.
std::map<int64_t, int64_t> epoch_over_two_sizes(int64_t size, int64_t n, int64_t batch, int64_t k,
                                                int64_t m, bool drop_last, int64_t* padding) {
  std::map<int64_t, int64_t> trained;
  for (int64_t r = 0; r < n; ++r) {
    ddp::DistributedSampler s(size, n, r, true, 11, drop_last);
    s.set_epoch(3);
    const std::vector<int64_t> mine = s.indices();
    for (int64_t i = 0; i < std::min<int64_t>(k * batch, mine.size()); ++i) ++trained[mine[i]];
  }
  const int64_t start = n * k * batch;
  int64_t rest = 0;
  for (int64_t r = 0; r < m; ++r) {
    ddp::DistributedSampler s(size, m, r, true, 11, drop_last);
    s.set_epoch(3, start);
    EXPECT_EQ(s.start(), start);
    for (int64_t i : s.indices()) ++trained[i];
    rest += s.num_samples();
  }
  *padding = start + rest - size;
  return trained;
}

TEST(DistributedSampler, StartContinuesTheEpochAtAnotherWorldSize) {
  int cases = 0;
  // (size, N ranks, per-rank batch, batches done, M ranks): shrinking and growing, sizes with
  // and without padding at either count.
  for (const auto& [size, n, batch, k, m] :
       std::vector<std::array<int64_t, 5>>{{256, 4, 16, 2, 2},
                                           {256, 2, 32, 1, 4},
                                           {101, 4, 5, 3, 3},
                                           {100, 3, 7, 2, 4},
                                           {37, 2, 4, 4, 5},
                                           {64, 4, 16, 0, 2},
                                           {1000, 8, 9, 10, 1}}) {
    int64_t padding = 0;
    const auto trained = epoch_over_two_sizes(size, n, batch, k, m, /*drop_last=*/false, &padding);
    ASSERT_EQ(static_cast<int64_t>(trained.size()), size) << "every index, size " << size;
    int64_t repeats = 0;
    for (const auto& [index, times] : trained) {
      ASSERT_GE(index, 0);
      ASSERT_LT(index, size);
      repeats += times - 1;
    }
    // Only the rest's padding repeats an index (fewer than M of them); the N-rank part trained
    // full batches of the unpadded permutation.
    EXPECT_EQ(repeats, padding) << "size " << size << " " << n << " -> " << m;
    EXPECT_LT(padding, m);
    ++cases;
  }
  // drop_last: no index twice; at most M - 1 of the rest dropped.
  int64_t padding = 0;
  const auto trained = epoch_over_two_sizes(101, 4, 5, 3, 3, /*drop_last=*/true, &padding);
  for (const auto& [index, times] : trained) EXPECT_EQ(times, 1) << index;
  EXPECT_LE(padding, 0);
  EXPECT_GT(static_cast<int64_t>(trained.size()), 101 - 3);
  EXPECT_EQ(cases, 7);
}

TEST(DistributedSampler, StartIsTheRestOfTheSamePermutationInGlobalBatches) {
  // 4 ranks x 16 for 2 batches, then 2 ranks x 32: each global batch of the rest is the same
  // contiguous range of the permutation as at 4 ranks (the global batch kept).
  const int64_t size = 256;
  std::vector<std::vector<int64_t>> four(4), two(2);
  for (int64_t r = 0; r < 4; ++r) {
    ddp::DistributedSampler s(size, 4, r, true, 5);
    s.set_epoch(2);
    four[r] = s.indices();
  }
  for (int64_t r = 0; r < 2; ++r) {
    ddp::DistributedSampler s(size, 2, r, true, 5);
    s.set_epoch(2, 2 * 4 * 16);
    two[r] = s.indices();
  }
  for (int64_t b = 2; b < 4; ++b) {
    std::multiset<int64_t> at_four, at_two;
    for (int64_t r = 0; r < 4; ++r)
      at_four.insert(four[r].begin() + b * 16, four[r].begin() + (b + 1) * 16);
    for (int64_t r = 0; r < 2; ++r) {
      at_two.insert(two[r].begin() + (b - 2) * 32, two[r].begin() + (b - 1) * 32);
    }
    EXPECT_EQ(at_four, at_two) << "global batch " << b;
  }
}

TEST(DistributedSampler, StartZeroIsTorchsSamplerAndBadStartsAreRefused) {
  ddp::DistributedSampler a(103, 3, 1, true, 9), b(103, 3, 1, true, 9);
  a.set_epoch(4);
  b.set_epoch(4, 0);
  EXPECT_EQ(a.indices(), b.indices());
  EXPECT_EQ(a.num_samples(), 35);
  b.set_epoch(4, 10);
  EXPECT_EQ(b.num_samples(), 31);  // 93 left over 3 ranks
  b.set_epoch(5);                  // a new epoch starts at its beginning
  EXPECT_EQ(b.start(), 0);
  EXPECT_EQ(b.num_samples(), 35);
  try {
    b.set_epoch(1, 103);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "start must be >= 0 and less than the data set's size 103 (got 103)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(b.set_epoch(1, -1), std::invalid_argument);
}

// A torch::data dataset whose example i is the number i: what a loader yields names the indices
// it was asked for.
struct IndexDataset : torch::data::datasets::Dataset<IndexDataset> {
  explicit IndexDataset(size_t n) : n(n) {}
  torch::data::Example<> get(size_t i) override {
    return {torch::tensor(static_cast<int64_t>(i)), torch::tensor(0)};
  }
  std::optional<size_t> size() const override { return n; }
  size_t n;
};

// Every index a loader yields in one pass, in order.
template <typename Loader>
std::vector<int64_t> one_pass(Loader& loader, std::vector<size_t>* batch_sizes = nullptr) {
  std::vector<int64_t> seen;
  for (auto& batch : loader) {
    if (batch_sizes) batch_sizes->push_back(static_cast<size_t>(batch.data.size(0)));
    for (int64_t i = 0; i < batch.data.size(0); ++i)
      seen.push_back(batch.data[i].template item<int64_t>());
  }
  return seen;
}

TEST(DataLoaderSampler, WorkersYieldTheSamplersIndicesEpochByEpoch) {
  const size_t n = 23;  // not a multiple of 3 ranks: the shard is padded, as PyTorch's is
  ddp::DistributedSampler sampler(static_cast<int64_t>(n), 3, 1, /*shuffle=*/true, /*seed=*/5);
  auto loader = torch::data::make_data_loader(
      IndexDataset(n).map(torch::data::transforms::Stack<>()), ddp::DataLoaderSampler(sampler),
      torch::data::DataLoaderOptions().batch_size(3).workers(2));
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    sampler.set_epoch(epoch);
    std::vector<size_t> sizes;
    epochs.push_back(one_pass(*loader, &sizes));
    EXPECT_EQ(epochs.back(), sampler.indices()) << "epoch " << epoch;
    EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 2})) << "epoch " << epoch;  // 8 per rank
  }
  EXPECT_NE(epochs[0], epochs[1]) << "set_epoch did not reach the loader's copy";
}

TEST(DataLoaderSampler, RefusesADataSetOfAnotherSize) {
  ddp::DistributedSampler sampler(10, 2, 0);
  ddp::DataLoaderSampler s(sampler);
  try {
    s.reset(11);
    FAIL() << "reset(11) accepted for a sampler of 10";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("11 examples but the DistributedSampler was built for 10"),
              std::string::npos)
        << e.what();
  }
}

TEST(DataLoaderSampler, SaveAndLoadKeepThePosition) {
  ddp::DistributedSampler sampler(20, 2, 1, true, 3);
  sampler.set_epoch(4);
  ddp::DataLoaderSampler s(sampler);
  s.reset();
  const auto first = s.next(3);
  ASSERT_TRUE(first.has_value());
  torch::serialize::OutputArchive out;
  s.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);

  ddp::DataLoaderSampler restored(sampler);
  torch::serialize::InputArchive in;
  std::istringstream input(bytes.str());
  in.load_from(input);
  restored.load(in);
  EXPECT_EQ(restored.position(), 3u);
  EXPECT_EQ(restored.next(100), s.next(100));  // the rest of the epoch, the same on both

  sampler.set_epoch(5);
  torch::serialize::InputArchive again;
  std::istringstream input2(bytes.str());
  again.load_from(input2);
  EXPECT_THROW(restored.load(again), std::invalid_argument);  // saved at epoch 4
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

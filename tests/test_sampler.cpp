#include <ddp/distributed_sampler.h>
#include <ddp/distributed_sampler.h>

#include "test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

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
    for (int64_t i = 0; i < batch.data.size(0); ++i) seen.push_back(batch.data[i].template item<int64_t>());
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
              std::string::npos) << e.what();
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

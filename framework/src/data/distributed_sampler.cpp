#include <ddp/distributed_sampler.h>

#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace ddp {

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  if (n < 0)
    throw std::invalid_argument("torch_randperm: n must be >= 0, got " + std::to_string(n));
  // torch's CPU generator is a standard mt19937 seeded with the low 32 bits of the seed.
  std::mt19937 engine(static_cast<uint32_t>(seed));
  std::vector<int64_t> r(static_cast<size_t>(n));
  if (n < static_cast<int64_t>(std::numeric_limits<uint32_t>::max() / 20)) {
    // ATen's randperm_cpu: a forward Fisher-Yates with one 32-bit draw per position.
    std::iota(r.begin(), r.end(), int64_t{0});
    for (int64_t i = 0; i + 1 < n; ++i) {
      const int64_t z = static_cast<int64_t>(engine() % static_cast<uint64_t>(n - i));
      std::swap(r[i], r[i + z]);
    }
    return r;
  }
  // Larger n: ATen's inside-out Fisher-Yates with 64-bit draws (high word first).
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hi = engine(), lo = engine();
    const int64_t z = static_cast<int64_t>(((hi << 32) | lo) % static_cast<uint64_t>(i + 1));
    r[i] = r[z];
    r[z] = i;
  }
  return r;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                       bool shuffle, int64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (dataset_size < 0) {
    throw std::invalid_argument("DistributedSampler: dataset_size must be >= 0, got " +
                                std::to_string(dataset_size));
  }
  if (num_replicas < 1) {
    throw std::invalid_argument("DistributedSampler: num_replicas must be >= 1, got " +
                                std::to_string(num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedSampler: invalid rank " + std::to_string(rank) +
                                ", rank should be in the interval [0, " +
                                std::to_string(num_replicas - 1) + "]");
  }
  num_samples_ = shard_size(dataset_size);
}

int64_t DistributedSampler::shard_size(int64_t n) const {
  // PyTorch's sizes: drop the tail so every rank gets the same count, or pad up to it.
  if (drop_last_ && n % num_replicas_ != 0)
    return (n - num_replicas_ + num_replicas_ - 1) / num_replicas_;
  return (n + num_replicas_ - 1) / num_replicas_;
}

void DistributedSampler::set_epoch(int64_t epoch, int64_t start) {
  if (start != 0 && (start < 0 || start >= dataset_size_)) {
    throw std::invalid_argument(
        "DistributedSampler::set_epoch: start must be >= 0 and less than "
        "the data set's size " +
        std::to_string(dataset_size_) + " (got " + std::to_string(start) + ")");
  }
  epoch_ = epoch;
  start_ = start;
  num_samples_ = shard_size(dataset_size_ - start);
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = torch_randperm(dataset_size_, static_cast<uint64_t>(seed_ + epoch_));
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // The rest of the epoch after start_ (all of it without one), shared as a whole epoch is.
  order.erase(order.begin(), order.begin() + start_);
  const int64_t total = total_size();
  if (drop_last_) {
    order.resize(static_cast<size_t>(total));
  } else if (!order.empty()) {
    // Pad by repeating the permutation (its rest) from its start, as often as needed.
    for (size_t i = 0; order.size() < static_cast<size_t>(total); ++i) {
      const int64_t repeated = order[i];
      order.push_back(repeated);
    }
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += num_replicas_)
    mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

int64_t DistributedSampler::num_batches(int64_t batch_size) const {
  if (batch_size < 1) {
    throw std::invalid_argument("DistributedSampler::num_batches: batch_size must be >= 1 (got " +
                                std::to_string(batch_size) + ")");
  }
  return (num_samples_ + batch_size - 1) / batch_size;
}

std::vector<int64_t> evaluation_shard(int64_t dataset_size, int64_t num_replicas, int64_t rank) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("evaluation_shard: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(num_replicas) + ")");
  }
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < dataset_size; i += num_replicas) mine.push_back(i);
  return mine;
}

}  // namespace ddp

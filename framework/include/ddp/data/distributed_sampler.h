#pragma once
// Which dataset indices each rank visits in an epoch: index for index the same as
// torch.utils.data.DistributedSampler, so a C++ run and a PyTorch run see identical shards.

#include <cstdint>
#include <vector>

namespace ddp {

class DistributedSampler {
 public:
  // Throws std::invalid_argument naming the bad argument (rank outside [0, num_replicas), ...).
  DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                     bool shuffle = true, int64_t seed = 0, bool drop_last = false);

  // The permutation is seeded with seed + epoch, so all ranks agree on it.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch; num_samples() of them. Without drop_last the
  // list is padded by repeating the start of the permutation, as PyTorch does.
  std::vector<int64_t> indices() const;

  int64_t num_samples() const { return num_samples_; }   // per rank
  int64_t dataset_size() const { return dataset_size_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t dataset_size_, num_replicas_, rank_;
  bool shuffle_;
  int64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_ = 0;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU.
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);

// The shard of an evaluation set for `rank`: every index exactly once over all ranks, no
// padding (indices rank, rank + num_replicas, ...), so metrics summed over ranks are exact.
std::vector<int64_t> evaluation_shard(int64_t dataset_size, int64_t num_replicas, int64_t rank);

}  // namespace ddp

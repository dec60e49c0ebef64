#pragma once
/// \file
/// Which dataset indices each rank visits in an epoch: index for index the same as
/// torch.utils.data.DistributedSampler, so a C++ run and a PyTorch run see identical shards.
///
/// An epoch is a permutation of the data set (seeded with seed + epoch), padded to a multiple of
/// the ranks by repeating its start (or cut with drop_last); rank r takes positions r, r + N,
/// r + 2N, ... of it. So after k batches of B on every rank, exactly the first N * k * B positions
/// were trained, and an epoch interrupted at N ranks can continue at M: set_epoch(epoch, start),
/// with start the positions trained so far, shares the rest (positions start.., padded or cut as
/// a whole epoch is) among the M ranks. Every sample is then trained at least once over the two
/// runs, and without drop_last at most once more: the padding repeats at most M - 1 positions, as
/// a whole epoch's does (an epoch of 896 resumed after 768 on 3 ranks trains 129: 1 twice). With
/// start 0 (the default) nothing differs from torch's sampler.

#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace ddp {

/// This rank's share of a data set's indices, epoch by epoch (this file's comment says how).
class DistributedSampler {
 public:
  /// Throws std::invalid_argument naming the bad argument (rank outside [0, num_replicas), ...).
  DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle = true,
                     int64_t seed = 0, bool drop_last = false);

  /// The permutation is seeded with seed + epoch, so all ranks agree on it. `start` > 0: the
  /// epoch continues from that position of its permutation (see this file's comment).
  /// Throws std::invalid_argument unless 0 <= start < dataset_size() (start 0 is always valid).
  void set_epoch(int64_t epoch, int64_t start = 0);
  /// The epoch set_epoch() set (0 before).
  int64_t epoch() const { return epoch_; }
  /// The position of the epoch's permutation this rank's share starts from (0: all of it).
  int64_t start() const { return start_; }

  /// This rank's indices for the current epoch; num_samples() of them. Without drop_last the
  /// list is padded by repeating the start of the permutation, as PyTorch does.
  std::vector<int64_t> indices() const;

  int64_t num_samples() const { return num_samples_; }  ///< per rank (of the rest after start())
  /// The batches of `batch_size` that num_samples() make, the last one short where it does not
  /// divide (a DataLoader's length without drop_last). Throws std::invalid_argument unless
  /// batch_size > 0.
  int64_t num_batches(int64_t batch_size) const;
  int64_t dataset_size() const { return dataset_size_; }  ///< as given
  /// num_samples() over all ranks (the data set, or its rest after start(), padded or cut with
  /// drop_last).
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t dataset_size_, num_replicas_, rank_;
  bool shuffle_;
  int64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t start_ = 0;
  int64_t num_samples_ = 0;

  // Per rank, for `n` positions shared by the ranks: PyTorch's sizes.
  int64_t shard_size(int64_t n) const;
};

/// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU.
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);

/// The shard of an evaluation set for `rank`: every index exactly once over all ranks, no
/// padding (indices rank, rank + num_replicas, ...), so metrics summed over ranks are exact.
std::vector<int64_t> evaluation_shard(int64_t dataset_size, int64_t num_replicas, int64_t rank);

/// A DistributedSampler for torch::data's DataLoader, as a Python program hands a
/// DistributedSampler to torch.utils.data.DataLoader.
///
///   ddp::DistributedSampler sampler(dataset.size().value(), world_size, rank, /*shuffle=*/true);
///   auto loader = torch::data::make_data_loader(
///       std::move(dataset), ddp::DataLoaderSampler(sampler),
///       torch::data::DataLoaderOptions().batch_size(64).workers(2));
///   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
///     sampler.set_epoch(epoch);               // as in Python: a new shuffle every epoch
///     for (auto& batch : *loader) { ... }
///   }
///
/// Contract: `sampler` must outlive it; each reset() (the start of a pass) takes the indices of
/// the sampler's epoch at that moment, and the pass yields them in order in batches of the
/// loader's batch size (kept with workers: DataLoaderOptions::enforce_ordering). reset(size) with
/// another size than the sampler's throws std::invalid_argument naming both. save/load keep the
/// epoch and the position in it; load() throws unless the sampler is at the saved epoch.
class DataLoaderSampler final : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  /// Hands out `sampler`'s indices (see the contract above).
  explicit DataLoaderSampler(const DistributedSampler& sampler);

  /// Starts a pass over the indices of the sampler's current epoch.
  void reset(std::optional<size_t> new_size = std::nullopt) override;
  /// The next `batch_size` indices of the pass; none at its end.
  std::optional<std::vector<size_t>> next(size_t batch_size) override;
  /// Writes the epoch and the position within it.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads what save() wrote.
  void load(torch::serialize::InputArchive& archive) override;

  /// How many of this epoch's indices have been handed out.
  size_t position() const { return position_; }

 private:
  const DistributedSampler* sampler_;
  std::vector<int64_t> indices_;  ///< this rank's indices for epoch_, from the last reset()
  int64_t epoch_ = -1;            ///< the sampler's epoch at the last reset(); -1 before it
  size_t position_ = 0;
};

}  // namespace ddp

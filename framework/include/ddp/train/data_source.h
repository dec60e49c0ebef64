#pragma once
/// \file
/// Where an epoch's training batches come from, on one rank: the indices of a DistributedSampler's
/// epoch, cut into batches, from a given batch on (a resumed epoch) up to a given end (a batch
/// limit). IndexSource gathers in-memory data on the training thread, one batch ahead;
/// DataLoaderSource runs LibTorch's DataLoader, whose workers make batches that take time to make;
/// BatchRangeSampler is the sampler such a DataLoader reads, for a loop of one's own:
///
///     auto loader = torch::data::make_data_loader(
///         dataset.map(torch::data::transforms::Stack<>()),
///         ddp::BatchRangeSampler(sampler, batch_size, first_batch, batches),
///         torch::data::DataLoaderOptions().batch_size(batch_size).workers(2));
///     for (auto& batch : *loader) { ... }   // batches first_batch .. batches-1 of the epoch
///
/// Contract: every source yields the batches of the same indices in the same order (the
/// sampler's indices() for its current epoch, batch b = indices [b * batch_size, (b + 1) *
/// batch_size), the last one shorter); which source a task uses changes nothing it trains on. A
/// batch is a function of its indices: anything random belongs in Task::prepare, which draws
/// from a generator the snapshots keep (workers run in any order; their results come in order).

#include <ddp/distributed_sampler.h>

#include <torch/data/dataloader.h>
#include <torch/data/dataloader_options.h>
#include <torch/data/samplers/base.h>
#include <torch/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

namespace detail {
/// Entries [begin, begin + count) of `indices`, cut at its end: batch b is
/// index_slice(indices, b * batch_size, batch_size).
inline std::vector<int64_t> index_slice(const std::vector<int64_t>& indices, int64_t begin,
                                        int64_t count) {
  const int64_t n = static_cast<int64_t>(indices.size());
  begin = std::min(n, begin);
  return std::vector<int64_t>(indices.begin() + begin,
                              indices.begin() + std::min(n, begin + count));
}
}  // namespace detail

/// Where the Trainer's training batches come from, one pass (part of an epoch) at a time, on
/// the training thread: start(), then next() once per batch. Task::train_source makes one.
template <typename Batch>
class DataSource {
 public:
  virtual ~DataSource() = default;
  /// Starts a pass over `sampler`'s current epoch (set_epoch done): this rank's indices in
  /// batches of `batch_size`, from batch `first` to batch `end` (exclusive, at most the shard's
  /// batch count), on `device` (a source may leave the batches on the CPU: the task moves them).
  virtual void start(const DistributedSampler& sampler, int64_t batch_size, int64_t first,
                     int64_t end, torch::Device device) = 0;
  /// The pass's next batch; called end - first times.
  virtual Batch next() = 0;
  /// Called in each step once its backward is queued: a source may make its next batch now,
  /// while the device computes. Default: nothing.
  virtual void ahead() {}
};

/// Gathers each batch with a function of its indices, on the training thread, the next one in
/// ahead().
template <typename Batch>
class IndexSource final : public DataSource<Batch> {
 public:
  /// Makes the batch of `indices` (this rank's, in order) on `device`.
  using Gather = std::function<Batch(const std::vector<int64_t>& indices, torch::Device device)>;
  explicit IndexSource(Gather gather) : gather_(std::move(gather)) {}  ///< `gather`: not empty

  void start(const DistributedSampler& sampler, int64_t batch_size, int64_t first, int64_t end,
             torch::Device device) override {
    indices_ = sampler.indices();
    batch_size_ = batch_size;
    next_ = first;
    end_ = end;
    device_ = device;
    ahead_.reset();
  }
  Batch next() override {
    if (ahead_) {
      Batch batch = std::move(*ahead_);
      ahead_.reset();
      ++next_;
      return batch;
    }
    return gather(next_++);
  }
  void ahead() override {
    if (!ahead_ && next_ < end_) ahead_ = gather(next_);
  }

 private:
  Batch gather(int64_t b) const {
    return gather_(detail::index_slice(indices_, b * batch_size_, batch_size_), device_);
  }

  Gather gather_;
  std::vector<int64_t> indices_;
  int64_t batch_size_ = 1, next_ = 0, end_ = 0;
  torch::Device device_ = torch::kCPU;
  std::optional<Batch> ahead_;  ///< batch next_, gathered in ahead()
};

/// A torch::data sampler for LibTorch's DataLoader: this rank's indices of `sampler`'s epoch at
/// each reset() (the DataLoader's begin()), batches [first, end) of `batch_size` only. It wraps
/// DataLoaderSampler (distributed_sampler.h): the same indices, and its check that the data set
/// and the sampler agree on the size. `sampler` must outlive it. next() with another batch size
/// than `batch_size` throws std::invalid_argument naming both (the loader's must be the same).
class BatchRangeSampler final : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  /// Throws std::invalid_argument unless batch_size >= 1 and 0 <= first <= end.
  BatchRangeSampler(const DistributedSampler& sampler, int64_t batch_size, int64_t first,
                    int64_t end);

  /// Back to the range's first batch of the sampler's current epoch (`new_size`: as
  /// DataLoaderSampler::reset).
  void reset(std::optional<size_t> new_size = std::nullopt) override;
  /// The next batch's indices (the last one may be shorter), nullopt after the range's end.
  std::optional<std::vector<size_t>> next(size_t batch_size) override;
  ///@{
  /// DataLoaderSampler's: the epoch and the position in it.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  ///@}

 private:
  DataLoaderSampler indices_;
  size_t batch_size_, begin_, end_;  ///< the range in samples
};

/// The most worker threads one rank's DataLoader may start. LibTorch starts them all with each
/// pass, before its first batch, and a few per core already keep a rank fed; with tens of
/// thousands the pass spends long creating threads and then fails ("Resource temporarily
/// unavailable", std::bad_alloc) naming nothing.
constexpr int64_t kMaxLoaderWorkers = 1024;

/// Throws std::invalid_argument "<name> must be from 0 to 1024 worker threads (got N): ..." unless
/// 0 <= workers <= kMaxLoaderWorkers; `name` says what gave the count (a program's "--workers").
/// A fixed bound, not the machine's: every rank parses the same flags and refuses alike.
void check_loader_workers(const std::string& name, int64_t workers);

/// LibTorch's DataLoader as a DataSource: at each start(), a loader over a copy of `dataset` (a
/// torch::data dataset whose batch type is the task's, e.g. dataset.map(Stack<>())) reading a
/// BatchRangeSampler, with `workers` threads (0: on the training thread). The loader and its
/// threads live for one pass: LibTorch's refuses a new pass while batches its workers fetched
/// ahead are unread, which a stop inside an epoch leaves. Batches come as the dataset makes
/// them (on the CPU for LibTorch's datasets).
template <typename Dataset>
class DataLoaderSource final : public DataSource<typename Dataset::BatchType> {
 public:
  using Batch = typename Dataset::BatchType;  ///< the dataset's batch type: the task's
  /// Keeps `dataset`, copied into each pass's loader; `workers`: threads (0: none; more than
  /// kMaxLoaderWorkers: std::invalid_argument, check_loader_workers).
  DataLoaderSource(Dataset dataset, size_t workers)
      : dataset_(std::move(dataset)), workers_(workers) {
    check_loader_workers("DataLoaderSource's workers",
                         static_cast<int64_t>(std::min<size_t>(workers, kMaxLoaderWorkers + 1)));
  }

  void start(const DistributedSampler& sampler, int64_t batch_size, int64_t first, int64_t end,
             torch::Device /*device*/) override {
    iterator_.reset();
    loader_ = std::make_unique<Loader>(dataset_, BatchRangeSampler(sampler, batch_size, first, end),
                                       torch::data::DataLoaderOptions()
                                           .batch_size(static_cast<size_t>(batch_size))
                                           .workers(workers_));
  }
  Batch next() override {
    if (!iterator_) {
      iterator_.emplace(loader_->begin());
    } else {
      ++*iterator_;
    }
    return std::move(**iterator_);
  }

 private:
  using Loader = torch::data::StatelessDataLoader<Dataset, BatchRangeSampler>;
  Dataset dataset_;
  size_t workers_;
  std::unique_ptr<Loader> loader_;
  std::optional<torch::data::Iterator<Batch>> iterator_;  ///< over loader_; destroyed before it
};

}  // namespace ddp

#include <ddp/train/data_source.h>

#include <stdexcept>
#include <string>

namespace ddp {

void check_loader_workers(const std::string& name, int64_t workers) {
  if (workers >= 0 && workers <= kMaxLoaderWorkers) return;
  throw std::invalid_argument(name + " must be from 0 to " + std::to_string(kMaxLoaderWorkers) +
                              " worker threads (got " + std::to_string(workers) +
                              "): the DataLoader starts them all with each pass, and a few per "
                              "core keep a rank fed");
}

BatchRangeSampler::BatchRangeSampler(const DistributedSampler& sampler, int64_t batch_size,
                                     int64_t first, int64_t end)
    : indices_(sampler) {
  if (batch_size < 1 || first < 0 || end < first) {
    throw std::invalid_argument(
        "BatchRangeSampler: needs batch_size >= 1 and 0 <= first <= end (got "
        "batch_size " +
        std::to_string(batch_size) + ", batches " + std::to_string(first) + " to " +
        std::to_string(end) + ")");
  }
  batch_size_ = static_cast<size_t>(batch_size);
  begin_ = static_cast<size_t>(first) * batch_size_;
  end_ = static_cast<size_t>(end) * batch_size_;
}

void BatchRangeSampler::reset(std::optional<size_t> new_size) {
  indices_.reset(new_size);
  if (begin_ > 0) indices_.next(begin_);  // the batches before the range: already trained
}

std::optional<std::vector<size_t>> BatchRangeSampler::next(size_t batch_size) {
  if (batch_size != batch_size_) {
    throw std::invalid_argument("BatchRangeSampler: the data loader asks for batches of " +
                                std::to_string(batch_size) +
                                " but the range was cut in batches of " +
                                std::to_string(batch_size_) + "; use the same batch size");
  }
  const size_t at = indices_.position();
  if (at >= end_) return std::nullopt;
  return indices_.next(std::min(batch_size, end_ - at));
}

void BatchRangeSampler::save(torch::serialize::OutputArchive& archive) const {
  indices_.save(archive);
}

void BatchRangeSampler::load(torch::serialize::InputArchive& archive) { indices_.load(archive); }

}  // namespace ddp

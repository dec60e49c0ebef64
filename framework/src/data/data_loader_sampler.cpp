#include <ddp/distributed_sampler.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ddp {

DataLoaderSampler::DataLoaderSampler(const DistributedSampler& sampler) : sampler_(&sampler) {}

void DataLoaderSampler::reset(std::optional<size_t> new_size) {
  if (new_size && static_cast<int64_t>(*new_size) != sampler_->dataset_size()) {
    throw std::invalid_argument("DataLoaderSampler: the data loader's data set has " +
                                std::to_string(*new_size) +
                                " examples but the DistributedSampler was built for " +
                                std::to_string(sampler_->dataset_size()));
  }
  indices_ = sampler_->indices();
  epoch_ = sampler_->epoch();
  position_ = 0;
}

std::optional<std::vector<size_t>> DataLoaderSampler::next(size_t batch_size) {
  if (epoch_ < 0) reset();  // a loader always resets first; a direct caller may not
  if (batch_size == 0) throw std::invalid_argument("DataLoaderSampler::next: batch_size is 0");
  if (position_ >= indices_.size()) return std::nullopt;
  const size_t end = std::min(indices_.size(), position_ + batch_size);
  std::vector<size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                            indices_.begin() + static_cast<std::ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void DataLoaderSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", torch::tensor(epoch_, torch::kInt64), /*is_buffer=*/true);
  archive.write("position", torch::tensor(static_cast<int64_t>(position_), torch::kInt64),
                /*is_buffer=*/true);
}

void DataLoaderSampler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor epoch = torch::empty({}, torch::kInt64), position = torch::empty({}, torch::kInt64);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  const int64_t saved_epoch = epoch.item<int64_t>();
  if (saved_epoch != sampler_->epoch()) {
    throw std::invalid_argument("DataLoaderSampler::load: saved at epoch " +
                                std::to_string(saved_epoch) +
                                " but the DistributedSampler is at epoch " +
                                std::to_string(sampler_->epoch()) + " (call set_epoch first)");
  }
  reset();
  const int64_t saved_position = position.item<int64_t>();
  if (saved_position < 0 || saved_position > static_cast<int64_t>(indices_.size())) {
    throw std::invalid_argument("DataLoaderSampler::load: position " +
                                std::to_string(saved_position) + " is outside this rank's " +
                                std::to_string(indices_.size()) + " indices");
  }
  position_ = static_cast<size_t>(saved_position);
}

}  // namespace ddp

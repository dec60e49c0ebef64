#pragma once
// The classification preset: the task the examples train (an in-memory uint8 ImageDataset, a
// model mapping normalised images to log-probabilities, nll_loss, argmax accuracy). The Trainer's
// ImageDataset constructor and fit() build it; a program can hand it to the task constructor too.
//
// Training batches are gathered one step ahead (ImageDataset::gather: on a GPU, copied on a side
// stream), then in their step augmented (TrainerOptions-style Augment, drawing from the Trainer's
// generator) and normalised, as torchvision orders its transforms. Evaluation sums the per-sample
// losses in float64 and counts correct predictions as the test metric "accuracy", so the test loss
// and the correct count do not depend on the batching or the ranks.

#include <ddp/train/image_dataset.h>
#include <ddp/train/task.h>

#include <functional>

namespace ddp {

// Maps a batch of uint8 pixels [B,C,H,W] to augmented pixels of the same shape, drawing from
// `generator` (seeded per rank and epoch: augment.h).
using Augment = std::function<torch::Tensor(const torch::Tensor&, at::Generator&)>;

class ClassificationTask : public Task<Batch> {
 public:
  // Maps a batch of normalised inputs to log-probabilities [B, classes].
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

  // `test` may be null (nothing to evaluate). The data sets must outlive the task.
  ClassificationTask(const ImageDataset& train, const ImageDataset* test, Forward forward,
                     Augment augment = {});

  int64_t train_size() const override { return train_.size(); }
  int64_t test_size() const override { return test_ ? test_->size() : 0; }
  std::vector<std::string> test_metrics() const override { return {"accuracy"}; }

  Batch train_batch(const std::vector<int64_t>& indices, torch::Device device) override;
  void prepare(Batch& batch, at::Generator& generator) override;
  StepOutput loss(Batch& batch) override;
  Batch test_batch(const std::vector<int64_t>& indices, torch::Device device) override;
  StepOutput evaluate(Batch& batch) override;

 private:
  const ImageDataset& train_;
  const ImageDataset* test_;
  Forward forward_;
  Augment augment_;
};

}  // namespace ddp

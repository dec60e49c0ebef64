#pragma once
/// \file
/// The classification preset: the task the examples train (an in-memory uint8 ImageDataset, a
/// model mapping normalised images to log-probabilities, nll_loss, argmax accuracy) and its report
/// format, which prints the seed scripts' lines.
///
///   auto forward = [&](const torch::Tensor& x) { return net->forward(x); };
///   ddp::ClassificationTask task(train, &test, forward, ddp::RandomCropFlip{4, true});
///   options.report.format = std::make_shared<ddp::ClassificationFormat>();
///   ddp::Trainer trainer(group, *net, task, optimizer, options, &model);
///
/// Batches are augmented in their step, then normalised, as torchvision orders its transforms.
/// Evaluation sums the per-sample losses in float64 and counts correct predictions as the metric
/// "accuracy" (its mean is the fraction correct), so neither depends on the batching or the ranks.
///
/// ClassificationFormat: "Train Epoch: 1 [640/60000 (1%)]\tLoss: 1.397769\tETA 0:01", "Test set:
/// Average loss: 0.3343, Accuracy: 8743/10000 (87%)", and "test acc" as a percentage in the
/// summary. The metrics file is the same as for any task.

#include <ddp/train/image_dataset.h>
#include <ddp/train/reporter.h>
#include <ddp/train/task.h>

#include <functional>
#include <string>

namespace ddp {

/// Maps a batch of uint8 pixels [B,C,H,W] to augmented pixels of the same shape, drawing from
/// `generator` (seeded per rank and epoch: augment.h), e.g. RandomCropFlip.
using Augment = std::function<torch::Tensor(const torch::Tensor&, at::Generator&)>;

/// Image classification on ImageDatasets (the examples' task): train_batch() gathers uint8
/// pixels, prepare() augments (when `augment` is set) and normalises, loss() is the NLL loss of
/// `forward`'s log-probabilities; evaluate() also sums the test loss per sample and the correct
/// predictions (argmax) as the metric "accuracy".
class ClassificationTask : public Task<Batch> {
 public:
  /// Maps a batch of normalised inputs to log-probabilities [B, classes].
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

  /// `test` may be null (nothing to evaluate). The data sets must outlive the task. Throws
  /// std::invalid_argument for an empty training or test set (it would train or evaluate
  /// nothing, and report "0/0" as if all were well).
  ClassificationTask(const ImageDataset& train, const ImageDataset* test, Forward forward,
                     Augment augment = {});

  int64_t train_size() const override { return train_.size(); }
  int64_t test_size() const override { return test_ ? test_->size() : 0; }
  /// "accuracy": the correct predictions.
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

/// The seed scripts' lines for a task whose test metric "accuracy" counts correct predictions.
class ClassificationFormat : public ReportFormat {
 public:
  std::string log_line(const ProgressLine& line) const override;
  std::string epoch_lines(const EpochResult& result, const std::string& ranks) const override;
  std::string metric_heading(const std::string& set, const Metric& metric) const override;
  std::string metric_cell(const std::string& set, const Metric& metric, int width) const override;
};

}  // namespace ddp

#include <ddp/train/classification.h>

#include <torch/torch.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

ClassificationTask::ClassificationTask(const ImageDataset& train, const ImageDataset* test,
                                       Forward forward, Augment augment)
    : train_(train), test_(test), forward_(std::move(forward)), augment_(std::move(augment)) {
  // An empty set would train (or evaluate) nothing and report "0/0 (0%)" as if all were well.
  if (train_.size() == 0)
    throw std::invalid_argument("ClassificationTask: the training set is empty");
  if (test_ && test_->size() == 0)
    throw std::invalid_argument("ClassificationTask: the test set is empty");
  if (!forward_) throw std::invalid_argument("ClassificationTask: the forward function is empty");
}

Batch ClassificationTask::train_batch(const std::vector<int64_t>& indices, torch::Device device) {
  // uint8 pixels: augmentation comes first, in prepare().
  return train_.gather(indices, 0, static_cast<int64_t>(indices.size()), device);
}

void ClassificationTask::prepare(Batch& batch, at::Generator& generator) {
  if (augment_) batch.inputs = augment_(batch.inputs, generator);
  batch.inputs = train_.normalise(batch.inputs);
}

StepOutput ClassificationTask::loss(Batch& batch) {
  StepOutput out;
  out.loss = torch::nll_loss(forward_(batch.inputs), batch.targets);
  out.samples = batch.targets.size(0);
  return out;
}

Batch ClassificationTask::test_batch(const std::vector<int64_t>& indices, torch::Device device) {
  return test_->batch(indices, 0, static_cast<int64_t>(indices.size()), device);
}

StepOutput ClassificationTask::evaluate(Batch& batch) {
  const torch::Tensor log_probs = forward_(batch.inputs);
  StepOutput out;
  // Per-sample losses summed in double: the total does not depend on how samples are batched.
  out.loss_sum = torch::nll_loss(log_probs, batch.targets, {}, torch::Reduction::None)
                     .to(torch::kDouble)
                     .sum();
  out.samples = batch.targets.size(0);
  out.sums.push_back(log_probs.argmax(1).eq(batch.targets).sum());
  return out;
}

namespace {

// The task's other metrics after the seed's line: ", name: mean" each.
std::string other_metrics(const std::vector<Metric>& list) {
  std::string text;
  char value[64];
  for (const Metric& m : list) {
    if (m.name == "accuracy") continue;
    std::snprintf(value, sizeof value, ", %s: %.6g", m.name.c_str(), m.mean());
    text += value;
  }
  return text;
}

bool is_accuracy(const std::string& set, const Metric& metric) {
  return set == "test" && metric.name == "accuracy";
}

}  // namespace

std::string ClassificationFormat::log_line(const ProgressLine& l) const {
  char text[160];
  std::snprintf(text, sizeof text, "Train Epoch: %lld [%lld/%lld (%.0f%%)]\tLoss: %.6f\tETA %s",
                static_cast<long long>(l.epoch), static_cast<long long>(l.seen),
                static_cast<long long>(l.dataset_size), l.percent, l.loss,
                format_duration(l.eta_seconds).c_str());
  return text;
}

std::string ClassificationFormat::epoch_lines(const EpochResult& r,
                                              const std::string& ranks) const {
  std::string text;
  char line[160];
  if (r.test_loss) {
    std::snprintf(line, sizeof line, "\nTest set: Average loss: %.4f", *r.test_loss);
    text += line;
    for (const Metric& m : r.test_metrics) {
      if (m.name != "accuracy") continue;
      // The metric is the count of correct predictions.
      std::snprintf(line, sizeof line, ", Accuracy: %lld/%lld (%.0f%%)",
                    static_cast<long long>(m.sum), static_cast<long long>(m.samples),
                    100.0 * m.mean());
      text += line;
    }
    text += other_metrics(r.test_metrics) + "\n";
  }
  if (!r.train_metrics.empty()) {
    std::snprintf(line, sizeof line, "%sTrain set: Average loss: %.4f", r.test_loss ? "" : "\n",
                  r.train_loss);
    text += line + other_metrics(r.train_metrics) + "\n";
  }
  return text + "\n" + timing_line(r, ranks) + "\n\n";
}

std::string ClassificationFormat::metric_heading(const std::string& set,
                                                 const Metric& metric) const {
  return is_accuracy(set, metric) ? "test acc" : ReportFormat::metric_heading(set, metric);
}

std::string ClassificationFormat::metric_cell(const std::string& set, const Metric& metric,
                                              int width) const {
  if (!is_accuracy(set, metric)) return ReportFormat::metric_cell(set, metric, width);
  char text[32];
  std::snprintf(text, sizeof text, "%*.2f%%", width - 1, 100.0 * metric.mean());
  return text;
}

}  // namespace ddp

#include <ddp/train/classification.h>

#include <torch/torch.h>

#include <utility>

namespace ddp {

ClassificationTask::ClassificationTask(const ImageDataset& train, const ImageDataset* test,
                                       Forward forward, Augment augment)
    : train_(train), test_(test), forward_(std::move(forward)), augment_(std::move(augment)) {}

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
  out.loss_sum =
      torch::nll_loss(log_probs, batch.targets, {}, torch::Reduction::None).to(torch::kDouble).sum();
  out.samples = batch.targets.size(0);
  out.sums.push_back(log_probs.argmax(1).eq(batch.targets).sum());
  return out;
}

}  // namespace ddp

#pragma once
/// \file
/// What the Trainer trains: a task says how many samples there are, how to gather a batch of them
/// by index, and what a batch's loss is. The Trainer does everything else (trainer.h).
///
/// Write a task by deriving from Task<YourBatch> (any copyable type: a tensor pair, a struct of
/// tensors, a tuple) and overriding train_size(), train_batch() and loss(); test_size() and
/// test_batch() to evaluate; evaluate() when evaluation differs from the training loss; metric
/// names and sums to report more than the loss; train_source() to read the training batches
/// through LibTorch's DataLoader and its worker threads (data_source.h). ClassificationTask
/// (classification.h) is the one the examples use.
///
/// Contract (the Trainer relies on it; a task that breaks it trains wrongly, or hangs the job):
/// - Every rank's task has the same train_size(), test_size() and metric names, and the batches
///   are a function of the indices alone (plus, in prepare(), of the generator it is handed): the
///   Trainer decides which indices each rank reads, so that every sample is seen in each epoch
///   over all ranks (once, but for the padding of a data set that does not divide among the
///   ranks: DistributedSampler's) and a resumed run is bit-identical to an uninterrupted one. train_source(),
///   when overridden, yields the batches train_batch() would for the same indices.
/// - train_batch() may be called one step ahead of the batch's use (while the previous step's
///   backward runs), and a DataLoader's workers make batches further ahead; anything random
///   belongs in prepare(), which runs in the batch's own step and draws from the generator the
///   Trainer seeds per (seed, rank, epoch) and keeps in snapshots. prepare() is also where a batch
///   a source left on the CPU moves to the device.
/// - loss() runs the model itself, not through the DistributedDataParallel wrapper: the Trainer
///   has done the wrapper's pre-forward work (buffer broadcast, re-attaching hooks) before it
///   calls loss(), and calls backward() on the loss it returns. It runs under autocast when
///   TrainerOptions::amp asks. It returns the batch's mean loss (a scalar with a graph) and the
///   batch's sample count; the epoch's train loss is the sample-weighted mean over all ranks.
/// - Metric sums: StepOutput::sums has one scalar per name of train_metrics() (evaluate(): of
///   test_metrics()), in that order, summed over an epoch's batches and all ranks (metrics.h).
///   What a sum means is the task's, and its report format's.
/// - evaluate() runs under NoGradGuard with the model in eval mode; each test sample is
///   evaluated exactly once over all ranks (evaluation_shard), so the sums equal one process's.

#include <ddp/train/data_source.h>
#include <ddp/train/metrics.h>

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <any>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

/// What a task's loss() or evaluate() returns for one batch on this rank.
struct StepOutput {
  /// The batch's mean loss, a scalar. Training calls backward() on it.
  torch::Tensor loss;
  /// The batch's samples: the weight of `loss` in the epoch's mean (and the denominator of every
  /// metric's mean).
  int64_t samples = 0;
  /// One scalar per metric name (see the contract above).
  std::vector<torch::Tensor> sums;
  /// Optional, evaluation only: the sum of the per-sample losses, so that the test loss does not
  /// depend on how the samples are batched; undefined: loss * samples.
  torch::Tensor loss_sum;
};

/// The interface the Trainer drives, with the batch type erased (std::any). Derive from Task<Batch>
/// below rather than from this.
class TrainingTask {
 public:
  virtual ~TrainingTask() = default;

  /// Samples of the training set (sharded over ranks by the Trainer); > 0.
  virtual int64_t train_size() const = 0;
  /// Samples of the test set; 0: fit() does not evaluate.
  virtual int64_t test_size() const { return 0; }
  ///@{
  /// Names of the sums loss() (train_metrics) and evaluate() (test_metrics) return. Lower case
  /// letters, digits and '_', unique: they become keys of the metrics file ("train_<name>").
  virtual std::vector<std::string> train_metrics() const { return {}; }
  virtual std::vector<std::string> test_metrics() const { return {}; }
  ///@}

  /// The training batches (Task::train_source, or train_batch() by index), type-erased.
  virtual std::unique_ptr<DataSource<std::any>> train_source_any() = 0;
  /// Task::prepare on the batch `batch` holds.
  virtual void prepare_any(std::any& batch, at::Generator& generator) = 0;
  /// Task::loss on the batch `batch` holds.
  virtual StepOutput loss_any(std::any& batch) = 0;
  /// Task::test_batch, wrapped in std::any.
  virtual std::any test_batch_any(const std::vector<int64_t>& indices, torch::Device device) = 0;
  /// Task::evaluate on the batch `batch` holds.
  virtual StepOutput evaluate_any(std::any& batch) = 0;
};

/// The base of a task whose batches are `Batch` (see the file's text for the contract); it
/// implements TrainingTask's type-erased calls on top of these.
template <typename Batch>
class Task : public TrainingTask {
 public:
  /// The training samples `indices` (this rank's, in order), on `device`.
  virtual Batch train_batch(const std::vector<int64_t>& indices, torch::Device device) = 0;
  /// In the batch's step, before loss(): augmentation and other per-step work, drawing only from
  /// `generator`. Default: nothing.
  virtual void prepare(Batch& batch, at::Generator& generator) {
    (void)batch;
    (void)generator;
  }
  /// Where the training batches come from. Default: train_batch() on the indices, one step ahead
  /// (IndexSource). Return a DataLoaderSource (data_source.h) to have LibTorch's DataLoader and
  /// its worker threads make them. Called once, when the Trainer is built.
  virtual std::unique_ptr<DataSource<Batch>> train_source() {
    return std::make_unique<IndexSource<Batch>>(
        [this](const std::vector<int64_t>& indices, torch::Device device) {
          return train_batch(indices, device);
        });
  }
  /// Forward and loss of a training batch (see the contract above).
  virtual StepOutput loss(Batch& batch) = 0;
  /// The test samples `indices`. Default: the training set's (override when test_size() > 0 and
  /// the test set is another).
  virtual Batch test_batch(const std::vector<int64_t>& indices, torch::Device device) {
    return train_batch(indices, device);
  }
  /// Forward and loss of a test batch, sums for test_metrics(). Default: loss() (then
  /// test_metrics() must name loss()'s sums: by default it is empty, and so are they).
  virtual StepOutput evaluate(Batch& batch) { return loss(batch); }

 private:
  /// The task's source, its batches wrapped in std::any.
  class AnySource final : public DataSource<std::any> {
   public:
    explicit AnySource(std::unique_ptr<DataSource<Batch>> source) : source_(std::move(source)) {}
    void start(const DistributedSampler& sampler, int64_t batch_size, int64_t first, int64_t end,
               torch::Device device) override {
      source_->start(sampler, batch_size, first, end, device);
    }
    std::any next() override { return std::any(source_->next()); }
    void ahead() override { source_->ahead(); }

   private:
    std::unique_ptr<DataSource<Batch>> source_;
  };

  std::unique_ptr<DataSource<std::any>> train_source_any() final {
    return std::make_unique<AnySource>(train_source());
  }
  void prepare_any(std::any& batch, at::Generator& generator) final {
    prepare(std::any_cast<Batch&>(batch), generator);
  }
  StepOutput loss_any(std::any& batch) final { return loss(std::any_cast<Batch&>(batch)); }
  std::any test_batch_any(const std::vector<int64_t>& indices, torch::Device device) final {
    return std::any(test_batch(indices, device));
  }
  StepOutput evaluate_any(std::any& batch) final { return evaluate(std::any_cast<Batch&>(batch)); }
};

}  // namespace ddp

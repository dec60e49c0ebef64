#pragma once
/// \file
/// What an epoch measures: each rank adds up its batches (the loss weighted by the samples, named
/// metric sums, the time per phase) on the device, without a host sync per step, and at the epoch
/// end one all-reduce turns every rank's sums into the epoch's result over all ranks.
///
///   ddp::EpochMeter meter({"abs_error"}, device);
///   for (...) {
///     ...
///     meter.add(loss, batch_samples, {(prediction - target).abs().sum()});
///   }
///   ddp::EpochResult result = meter.reduce(group.cpu(), epoch);   // every rank, collective
///
/// Invariants: a Metric's mean is its sum per sample; every rank's meter has the same metric names,
/// and every rank calls reduce() at the same point. state() and restore() carry an epoch's sums
/// through a step snapshot, so a resumed epoch reports the same sums as an uninterrupted one.

#include <ddp/communicator.h>

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

/// A metric of an epoch, over all ranks.
struct Metric {
  std::string name;     ///< the task's name for it (TrainingTask::train_metrics, test_metrics)
  double sum = 0;       ///< over every batch of every rank
  int64_t samples = 0;  ///< the samples those batches held
  /// sum / samples, the mean per sample; 0 when there were no samples.
  double mean() const { return samples > 0 ? sum / static_cast<double>(samples) : 0.0; }
};

/// Wall seconds per phase of the training steps, averaged over ranks in an EpochResult.
struct PhaseTimes {
  double data = 0;              ///< gathering and preparing the batch
  double forward_backward = 0;  ///< excluding the gradient sync that runs inside backward
  double sync = 0;              ///< gradient all-reduce
  double optimizer = 0;         ///< zero_grad + step
};

/// An epoch's training (and evaluation) over all ranks: what the Reporter prints and writes.
struct EpochResult {
  int64_t epoch = 0;           ///< 1-based; 0: an epoch stopped early (Trainer::train_epoch)
  double train_loss = 0;       ///< mean over every sample trained on, all ranks
  int64_t samples = 0;         ///< all ranks
  double seconds = 0;          ///< wall time of the training phase (slowest rank)
  double samples_per_sec = 0;  ///< samples / seconds
  PhaseTimes phases;           ///< where the training phase's time went, averaged over ranks
  /// The most GPU memory tensors held at once during the epoch, the largest over the ranks, in
  /// MiB (the caching allocator's count, as torch.cuda.max_memory_allocated; the Trainer resets
  /// the device's peak when an epoch starts). -1 when training on the CPU.
  double gpu_memory_peak_mb = -1;
  std::vector<Metric> train_metrics;  ///< one per TrainingTask::train_metrics name, in order
  ///@{
  /// Set when the epoch was evaluated: the mean test loss per sample, and one Metric per
  /// TrainingTask::test_metrics name (empty when not evaluated).
  std::optional<double> test_loss;
  std::vector<Metric> test_metrics;
  ///@}
};

/// An evaluation over a whole test set, all ranks.
struct Evaluation {
  double loss = 0;      ///< mean loss per sample
  int64_t samples = 0;  ///< test samples, all ranks
  /// One per TrainingTask::test_metrics name, in order.
  std::vector<Metric> metrics;
};

/// The meter of the file's text.
class EpochMeter {
 public:
  /// `metrics`: the names of the sums add() takes, in that order. Sums are kept in float64 on
  /// `device`.
  EpochMeter(std::vector<std::string> metrics, torch::Device device);

  /// Adds a batch: its mean loss (a scalar; detached here), its sample count and one scalar per
  /// metric name. Throws std::invalid_argument when the loss is not a scalar or the sums are not
  /// one scalar per name.
  void add(const torch::Tensor& loss, int64_t samples, const std::vector<torch::Tensor>& sums = {});

  /// The phase times of this rank; the caller adds to them. The gradient sync runs inside
  /// backward, so a caller timing backward counts it in forward_backward and hands the sync time
  /// to state() and reduce() (DistributedDataParallel::sync_seconds() since the epoch began);
  /// reduce() adds it to `sync` and takes it out of forward_backward.
  PhaseTimes& phases() { return phases_; }

  const std::vector<std::string>& metrics() const { return names_; }  ///< as constructed

  /// What a step snapshot keeps of this rank's epoch so far: float64 [7 + metrics] (loss sum,
  /// samples, seconds, the four phases, then the metric sums). Reads the device. `sync_seconds`:
  /// the gradient sync of this epoch since the meter was built (not counting a restored part).
  torch::Tensor state(double sync_seconds = 0) const;
  /// Continues from a state() of a meter with the same metrics. Throws std::runtime_error when
  /// the size says it was written for other metrics.
  void restore(const torch::Tensor& state);

  /// Collective over `comm`: the epoch over all ranks (sums of every rank, seconds of the
  /// slowest, phases averaged). `sync_seconds` as for state().
  EpochResult reduce(Communicator& comm, int64_t epoch, double sync_seconds = 0) const;

 private:
  std::vector<std::string> names_;
  torch::Tensor loss_sum_;           ///< float64 scalar on the device
  std::vector<torch::Tensor> sums_;  ///< float64 scalars on the device
  int64_t samples_ = 0;
  PhaseTimes phases_;
  double restored_seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ddp

#pragma once
/// \file
/// What a training run shows and writes, for any loop: during an epoch, a live progress bar on a
/// terminal or log lines with an ETA elsewhere (ProgressMode, progress.h); after it, the epoch's
/// lines and one JSON line in the metrics file; at the end, a summary table; on a stop, where the
/// ranks stopped and what they saved. Rank 0 prints and writes; every rank makes the same calls,
/// because the loss shown is averaged over the ranks (one all-reduce every log_interval batches).
///
///   ddp::Reporter reporter(group, options);
///   reporter.start_run(start);                                 // the metrics file
///   for (epoch ...) {
///     reporter.start_epoch({epoch, first, batches, batches_per_epoch, batch_size, train_size,
///                           start.sampler_offset, start.sampler_start});  // EpochStart
///     for (b ...) { ...; reporter.batch_done(b, loss, samples); }
///     reporter.end_epoch();
///     reporter.epoch_done(result);                             // EpochMeter::reduce, + evaluation
///   }                                 // (with a checkpoint: print_epoch, save, write_metrics)
///   reporter.end_run(results);
///
/// The text is a ReportFormat's: generic lines by default ("Epoch 1 [640/60000 (1%)] loss 0.52
/// ETA 0:12", "Train set: loss 0.5267, abs_error 0.1"), another format for other lines (the
/// classification preset's prints the seed scripts': classification.h). The bar, the metrics file
/// and the summary's layout are the same for every format.
///
/// The metrics file: one JSON object per line, of two kinds.
///  - An epoch line, after each epoch, in this order: epoch, train_loss, train_<metric>...,
///    test_loss, test_<metric>... (each metric's mean per sample), samples_per_sec, seconds,
///    samples, ranks, data_seconds, forward_backward_seconds, sync_seconds, optimizer_seconds
///    (and gpu_memory_peak_mb on a GPU). It has no "kind".
///  - A step record, every log_interval batches (when the loss is averaged): "kind": "step",
///    epoch, batch (of the epoch, from 0), step (optimizer steps taken, this one included), loss
///    (the batch's, averaged over the ranks), then what the loop passed (StepScalars): lr,
///    grad_norm, and samples_per_sec (over all ranks, since the previous record), then, when
///    the loop timed the phases, data_share, forward_backward_share, sync_share and
///    optimizer_share: each phase's seconds since the previous record (averaged over the ranks)
///    over the wall seconds since it (rank 0's).
/// A fresh run starts a new file; a resumed run keeps the lines up to its snapshot's epoch and step
/// and drops the rest (written after the snapshot by the run that stopped).
///
/// With ReporterOptions::tensorboard_dir, rank 0 writes the same numbers as TensorBoard scalars
/// to a new event file there ("step/<key>" at the record's step, "epoch/<key>" at the epoch), the
/// run's hyperparameters (ReporterOptions::hparams), and in a resumed run TensorBoard's restart
/// mark at the step after the snapshot's, which drops the steps the stopped run wrote after it.

#include <ddp/process_group.h>
#include <ddp/train/checkpointer.h>
#include <ddp/train/metrics.h>
#include <ddp/train/progress.h>
#include <ddp/train/stop_agreement.h>

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

namespace detail {
class TensorBoardWriter;  ///< src/train/tensorboard_writer.h
}  // namespace detail

/// A progress line's numbers (ProgressMode::Log).
struct ProgressLine {
  int64_t epoch = 0;         ///< 1-based
  int64_t seen = 0;          ///< samples of the epoch before this batch, over all ranks
  int64_t dataset_size = 0;  ///< samples in the training set
  double percent = 0;        ///< of the epoch's batches done before this one
  double loss = 0;           ///< this batch's loss, averaged over ranks
  double eta_seconds = -1;   ///< the epoch's time left; < 0: unknown
};

/// The text of a report. Pure: numbers in, lines out. Derive to print other lines.
class ReportFormat {
 public:
  virtual ~ReportFormat() = default;
  /// A log line, without newline: "Epoch 1 [640/60000 (1%)] loss 1.397769 ETA 0:01".
  virtual std::string log_line(const ProgressLine& line) const;
  /// What rank 0 prints after an epoch (and its evaluation), newlines included; `ranks` is
  /// "2 rank(s)". Generic: "Train set: loss 0.5267, abs_error 0.1234", "Test set: ..." when
  /// evaluated, then the timing line.
  virtual std::string epoch_lines(const EpochResult& result, const std::string& ranks) const;
  ///@{
  /// A metric's column in the summary table: its heading and its cell for an epoch, right
  /// aligned in the heading's width. `set` is "train" or "test". Generic: "test_<name>" (at least
  /// 10 wide) and the mean per sample.
  virtual std::string metric_heading(const std::string& set, const Metric& metric) const;
  virtual std::string metric_cell(const std::string& set, const Metric& metric, int width) const;
  ///@}

  /// The end-of-run table, one row per epoch: train loss and metrics, test loss and metrics
  /// (when the first epoch has them), time, samples/s over all ranks, the gradient sync's share.
  std::string summary_table(const std::vector<EpochResult>& epochs) const;
  /// "Epoch 1: 1.30 s, 985 samples/s over 1 rank(s) | data 0.9%, forward+backward 94.6%,
  /// gradient sync 0.0%, optimizer 4.4%", without newline; without the phases when none was
  /// timed (a loop that does not time them).
  static std::string timing_line(const EpochResult& result, const std::string& ranks);
  /// "Snapshots: 12 written (10 inside epochs, 2 at epoch ends), 0.84 s in all, mean 70.0 ms,
  /// max 210.0 ms: 3.1% of 27.10 s of training", without newline; `run_seconds` is the training's
  /// wall time (the share is left out when it is 0).
  static std::string snapshot_line(const SnapshotCost& cost, double run_seconds);
};

/// What the Reporter shows and writes.
struct ReporterOptions {
  ProgressMode progress = ProgressMode::Auto;  ///< rank 0's bar or log lines (progress.h)
  /// Batches between loss averages (and log lines, and step records); 0: none.
  int64_t log_interval = 10;
  std::string metrics_file;  ///< rank 0 writes its epoch lines and step records here; empty: none
  std::string tensorboard_dir;  ///< rank 0 writes a TensorBoard event file here; empty: none
  /// The run's hyperparameters, as (name, value) texts, for TensorBoard's hparams plugin (a text
  /// that is wholly a number is written as one, "true"/"false" as booleans).
  std::vector<std::pair<std::string, std::string>> hparams;
  std::shared_ptr<const ReportFormat> format;  ///< null: ReportFormat's generic lines
};

/// What a loop knows of a batch besides its loss, for the step records (every log_interval
/// batches). What is left empty is left out of the record. Every rank passes the same fields.
struct StepScalars {
  /// Optimizer steps taken so far, this batch's included; < 0: the Reporter counts batches from
  /// the resume point's step (right without gradient accumulation).
  int64_t step = -1;
  std::optional<double> lr;         ///< the learning rate this batch's step used
  std::optional<double> grad_norm;  ///< the gradients' global 2-norm (before clipping)
  /// This batch's phase times on this rank, the gradient sync taken out of forward_backward
  /// (EpochMeter::phases()' meaning); summed until the next record.
  std::optional<PhaseTimes> phases;
};

/// An epoch as the progress display counts it. In an epoch re-sharded at resume (another world
/// size or batch size: EpochStart), batch b is the sampler's batch b - sampler_offset of the rest
/// that starts at position sampler_start of the epoch's order; elsewhere both are 0.
struct EpochPlan {
  int64_t epoch = 1;              ///< 1-based
  int64_t first_batch = 0;        ///< > 0 in a resumed epoch
  int64_t batches = 0;            ///< the epoch trains batches [first_batch, batches)
  int64_t batches_per_epoch = 0;  ///< of this rank's whole shard: the percentage's denominator
  int64_t batch_size = 0;         ///< samples per batch and rank
  int64_t dataset_size = 0;       ///< samples in the training set
  int64_t sampler_offset = 0;     ///< EpochStart::sampler_offset
  int64_t sampler_start = 0;      ///< EpochStart::sampler_start

  /// Samples of the epoch before batch `b`, over `ranks` ranks: those before the rest, then the
  /// rest's batches before b (ProgressLine::seen).
  int64_t samples_before(int64_t b, int ranks) const {
    return sampler_start + (b - sampler_offset) * batch_size * ranks;
  }
  /// The epoch's share before batch `b`, in percent (ProgressLine::percent): b of
  /// batches_per_epoch, as PyTorch's examples print it (batch_idx over len(train_loader)); in a
  /// re-sharded epoch the samples before the rest, then the rest's share of its batches.
  double percent_before(int64_t b) const {
    const int64_t rest_batches = batches_per_epoch - sampler_offset;
    if (rest_batches <= 0) return 0.0;
    const double rest_done =
        static_cast<double>(b - sampler_offset) / static_cast<double>(rest_batches);
    if (sampler_start == 0) return 100.0 * rest_done;
    if (dataset_size <= 0) return 0.0;
    const double before = static_cast<double>(sampler_start);
    const double size = static_cast<double>(dataset_size);
    return 100.0 * (before + rest_done * (size - before)) / size;
  }
};

/// The reporter of the file's text.
class Reporter {
 public:
  /// Throws std::invalid_argument naming ReporterOptions::log_interval when it is negative.
  Reporter(ProcessGroup& group, ReporterOptions options);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  /// Before the first epoch: opens the metrics file (rank 0) as `start` says (a fresh run starts
  /// a new file, a resumed one keeps the lines of start.epochs_done() epochs). Throws
  /// std::runtime_error naming the file and the reason (strerror) when it cannot be written.
  void start_run(const ResumePoint& start);
  /// Before the epoch's first batch: restarts the epoch's clock, counts and bar. Local.
  void start_epoch(const EpochPlan& plan);
  /// After batch `b` of the epoch, with its mean loss (on any device), its samples and what else
  /// the loop knows of it. Every log_interval batches the loss (and phase times) are averaged over
  /// the ranks: a collective, so every rank calls it for every batch; rank 0 then writes a step
  /// record. A record that cannot be written does not throw here, inside the epoch: rank 0 says so
  /// on stderr, writes no more records, and the next write_metrics throws the error.
  void batch_done(int64_t b, const torch::Tensor& loss, int64_t samples,
                  const StepScalars& scalars = {});
  /// After the epoch's batches: ends the bar's line.
  void end_epoch();
  /// Rank 0: print_epoch, then write_metrics. A loop that saves a checkpoint at the epoch's end
  /// calls the two itself with the save between them, so that a failed metrics write ends the job
  /// with the epoch saved.
  void epoch_done(const EpochResult& result);
  /// Rank 0: the epoch's lines.
  void print_epoch(const EpochResult& result);
  /// Rank 0: the epoch's line in the metrics file and its scalars in TensorBoard, when asked.
  /// Throws std::runtime_error naming the file and the reason (strerror: ENOSPC for a full disk)
  /// when a write fails, this one or a step record's since start_run.
  void write_metrics(const EpochResult& result);
  /// Rank 0: "Summary over 2 rank(s):" and the table of `epochs` (nothing when empty); then,
  /// when snapshots were written, their cost over `run_seconds` (ReportFormat::snapshot_line).
  void end_run(const std::vector<EpochResult>& epochs, const SnapshotCost& snapshots = {},
               double run_seconds = 0);
  /// Rank 0: "Stopped by SIGTERM (rank 1) before batch 3 of epoch 2 (step 9): wrote <snapshot>
  /// 0.12 s after the signal; resume from it to continue" (or that nothing was saved).
  void stopped(const StopAgreement& stop, const TrainingPosition& at, const std::string& snapshot);

  /// "2 rank(s)".
  std::string ranks() const;

 private:
  ProcessGroup& group_;
  ReporterOptions options_;
  std::shared_ptr<const ReportFormat> format_;
  ProgressMode mode_;  ///< resolved on rank 0; None elsewhere
  /// Rank 0: writes a step record to the metrics file and TensorBoard.
  void write_step_record(int64_t b, double loss, const double* phases, const StepScalars& scalars);
  /// Rank 0: a line to the metrics file; throws naming it and the reason when the write fails.
  void append_metrics_line(const std::string& line);

  std::ofstream metrics_;
  std::unique_ptr<detail::TensorBoardWriter> tensorboard_;
  /// What the next step record covers: since the previous record (or the epoch's start).
  std::chrono::steady_clock::time_point recorded_{};
  int64_t record_samples_ = 0;  ///< this rank's
  PhaseTimes record_phases_;    ///< this rank's
  int64_t counted_step_ = 0;    ///< StepScalars::step < 0: the resume point's step + batches since
  std::string write_error_;     ///< a step record's failed write, thrown by write_metrics
  /// The epoch in progress.
  EpochPlan plan_;
  std::chrono::steady_clock::time_point started_{}, drawn_{};
  int64_t samples_ = 0;     ///< this rank's, since start_epoch
  double shown_loss_ = -1;  ///< the latest averaged loss; -1 before the first
  bool bar_drawn_ = false;
};

}  // namespace ddp

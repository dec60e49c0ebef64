#pragma once
/// \file
/// The step boundary of any training loop: the ranks' one agreement per step (a stop signal, a
/// loss that was not finite, the snapshot timer), the snapshots (it owns the Checkpointer), and
/// where each epoch starts after a resume, at the same or another world size:
///
///   ddp::StepBoundary boundary(group, ddp::Checkpointer(group, model, optimizer, options));
///   const ddp::ResumePoint& resumed = boundary.resume();                // collective
///   for (int64_t epoch = resumed.position.epoch; epoch <= epochs; ++epoch) {
///     const ddp::EpochStart start = boundary.start_epoch(epoch, sampler, batch_size);
///     ... if (start.rank_state.generator.defined()) restore it (and .values) ...
///     const int64_t batches = start.batches(sampler, batch_size);
///     for (int64_t b = start.first_batch; b < batches; ++b) {  // sampler: sampler_batch(b)
///       if (boundary.at_step(b, step, [&] { return ddp::RankState{...}; })) {
///         reporter.stopped(boundary.stop(), boundary.position(), boundary.snapshot());
///         return ddp::kStoppedExitCode;                                 // 75: saved
///       }
///       ... the step ...
///     }
///     boundary.end_epoch();
///     boundary.checkpointer().save_epoch(epoch, step);
///   }
///   boundary.end_run(epochs);  // rank 0 says when there was nothing to train, or a late signal
///
/// The agreement: one all-reduce per stop check carries this rank's stop signal
/// (stop_agreement.h), its first step whose loss was not finite, and whether its snapshot timer is
/// due (Checkpointer::time_due: clocks differ between ranks, and a snapshot is collective). It is
/// started without waiting and read at the next boundary, so no boundary waits for a round trip:
/// the ranks stop, or fail on a non-finite loss, one boundary after the one that sent it, all at
/// the same one. The first check (of the run, and of each epoch after end_epoch) and a boundary
/// that writes a snapshot agree on their own values, waiting: a signal during start-up, or in an
/// epoch's last steps, stops the ranks before the next step, and a non-finite loss in the step
/// just taken is refused before it is saved. Timed snapshots therefore fall on the boundary after
/// a stop check.
///
/// Re-sharding: at the same world size and per-rank batch size each rank continues its own shard
/// at the snapshot's batch, with its RankState. Otherwise the rest of the epoch's sample order
/// (from the snapshot's samples done) is re-sharded over this run's ranks (DistributedSampler::
/// set_epoch's start): every sample of the epoch is still trained, once but for the padding of a
/// rest that does not divide among the ranks (at most ranks - 1 positions repeat samples, as in
/// any epoch; rank 0 says how many), batches are counted on from the snapshot's, and at another
/// world size no rank's state is restored (it is per rank).
///
/// Invariants: every rank makes the same calls in the same order (they are collective); an epoch's
/// start_epoch() comes before its at_step() calls.

#include <ddp/distributed_sampler.h>
#include <ddp/process_group.h>
#include <ddp/train/checkpointer.h>
#include <ddp/train/snapshot.h>
#include <ddp/train/stop_agreement.h>

#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ddp {

class Work;  // communicator.h

/// Where a loop trains an epoch (StepBoundary::start_epoch). Batch b of the epoch is the sampler's
/// batch b - sampler_offset (its indices [(b - sampler_offset) * batch_size, ...)).
struct EpochStart {
  int64_t first_batch = 0;     ///< the first batch to train; > 0: the epoch resumed inside
  int64_t sampler_offset = 0;  ///< > 0 only in an epoch re-sharded at its batch sampler_offset
  int64_t sampler_start = 0;   ///< the position of the epoch's order the sampler starts from
  /// Resumed inside the epoch at the same world size: this rank's state as saved; else empty
  /// (at another world size no rank's state is restored).
  RankState rank_state;

  /// The epoch's batches on this rank, counted from its first (batch 0), for a `sampler` that
  /// start_epoch() set.
  int64_t batches(const DistributedSampler& sampler, int64_t batch_size) const {
    return sampler_offset + sampler.num_batches(batch_size);
  }
  /// The sampler's batch that is the epoch's batch `b`.
  int64_t sampler_batch(int64_t b) const { return b - sampler_offset; }
};

/// How much of an epoch a loop trains, the one count that the Trainer, the schedules built for it
/// and a hand-written loop share: `batches` of this rank's (DistributedSampler::num_batches, or
/// EpochStart::batches in a re-sharded epoch), cut to `limit` when it is > 0, and the optimizer
/// steps they make in groups of `accumulate` (the last group may be short).
struct EpochLength {
  int64_t batches = 0;  ///< trained on each rank
  int64_t steps = 0;    ///< optimizer steps
};
/// Throws std::invalid_argument unless batches >= 0, limit >= 0 and accumulate >= 1.
EpochLength epoch_length(int64_t batches, int64_t limit = 0, int64_t accumulate = 1);

/// The step boundary of the file's text.
class StepBoundary {
 public:
  /// `stop_check_every`: steps between the agreements (StopAgreement's `every`; 0: none, and no
  /// signal handlers). Throws std::invalid_argument naming the option when it is negative, or 0
  /// with CheckpointerOptions::every_seconds (the timer is agreed at the checks).
  StepBoundary(ProcessGroup& group, Checkpointer checkpointer, int64_t stop_check_every = 1);
  /// Waits for the last boundary's agreement (every rank started it).
  ~StepBoundary();
  StepBoundary(const StepBoundary&) = delete;
  StepBoundary& operator=(const StepBoundary&) = delete;

  /// Collective: Checkpointer::resume; the point is kept for start_epoch().
  const ResumePoint& resume(torch::optim::LRScheduler* scheduler = nullptr);
  /// resume()'s point (before it: a fresh start's).
  const ResumePoint& resumed() const { return resume_; }

  /// Collective only through its checks (none communicate). Sets `sampler` to `epoch` and says
  /// where the epoch starts (above), `batch_size` per rank. The resumed epoch's start is handed
  /// out once: a second start_epoch of it starts at its beginning. Throws std::runtime_error
  /// naming the snapshot when it records more samples done than the sampler's data set has.
  EpochStart start_epoch(int64_t epoch, DistributedSampler& sampler, int64_t batch_size);

  /// Collective, at the step boundary before batch `batch` of the epoch start_epoch() started,
  /// after `step` optimizer steps: reads the agreement started at the boundary before, starts
  /// this one's (every stop_check_every steps), then writes a step snapshot when the ranks stop
  /// or one is due (Checkpointer::at_boundary; calls `rank_state` only then; `{}` for none).
  /// `nonfinite_loss_step`: the first step whose loss was not finite on this rank, -1 for none.
  /// Returns whether the ranks stop here. Throws TrainingDiverged (divergence.h) on every rank,
  /// before any snapshot, when some rank's loss was not finite: what() is "the loss of rank R was
  /// not finite (first at step S)".
  bool at_step(int64_t batch, int64_t step, const std::function<RankState()>& rank_state,
               int64_t nonfinite_loss_step = -1);

  /// Collective, after the epoch's last step and before its snapshot (save_epoch): agrees on
  /// this rank's non-finite loss (as at_step, waiting; once an epoch), after the agreement in
  /// flight. Throws TrainingDiverged as at_step does. A stop signal is agreed at once at the next
  /// stop check (with a check every step: before the next epoch's first batch).
  void end_epoch(int64_t nonfinite_loss_step = -1);

  /// Collective, after the loop's last epoch (`last_epoch`, the run's: --epochs) and its snapshot,
  /// in a run that was not stopped. Rank 0 says what would otherwise end with status 0 unsaid:
  ///  - resumed at or past the end: "Nothing left to train: <snapshot> is the end of epoch 2
  ///    (step 24), and this run ends at epoch 2: the run is complete; give more epochs to train
  ///    on";
  ///  - a stop signal after the last step boundary (in the last step, the evaluation, the
  ///    snapshot), where no boundary is left to stop at: "SIGTERM (rank 1) came after the run's
  ///    last step: the run is complete (saved <snapshot>); nothing is left to resume".
  /// Agrees on the signal in one all-reduce (none when stop checks are off, or the ranks stopped).
  void end_run(int64_t last_epoch);

  ///@{
  /// The newest boundary (with the samples done) and the snapshot written there ("" when none).
  const TrainingPosition& position() const { return position_; }
  const std::string& snapshot() const { return snapshot_; }
  ///@}

  const StopAgreement& stop() const { return stop_; }  ///< the agreement: whether, why, who
  ///@{
  /// The Checkpointer it owns: for the epoch-end snapshots (save_epoch) and its cost().
  Checkpointer& checkpointer() { return checkpointer_; }
  const Checkpointer& checkpointer() const { return checkpointer_; }
  ///@}

 private:
  /// This boundary's values: StopAgreement's, then the non-finite loss and the timer.
  torch::Tensor values(int64_t nonfinite_loss_step) const;
  /// Acts on agreed values: the stop decided, TrainingDiverged thrown; returns the timer's.
  bool read(const torch::Tensor& agreed);
  /// Throws TrainingDiverged when the agreed values name a rank whose loss was not finite.
  void refuse_nonfinite(const torch::Tensor& agreed) const;
  /// Rank 0: the line of a re-sharded rest that does not divide among the ranks (its padding).
  void say_uneven_rest(int64_t epoch, const DistributedSampler& sampler) const;

  ProcessGroup& group_;
  StopAgreement stop_;
  Checkpointer checkpointer_;
  ResumePoint resume_;
  EpochStart epoch_;        ///< the epoch in progress
  int64_t batch_size_ = 0;  ///< its per-rank batch size
  TrainingPosition position_;
  std::string snapshot_;
  torch::Tensor sent_;               ///< the newest agreement's values (none before the first)
  std::unique_ptr<Work> in_flight_;  ///< started at the newest boundary, or none
};

}  // namespace ddp

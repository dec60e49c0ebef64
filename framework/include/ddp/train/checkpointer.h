#pragma once
/// \file
/// Snapshots of a training run and resuming from them, for any loop: at every epoch end (the
/// weights as model_with_epoch<N>.pt, as the seed scripts write them, and snapshot_epoch<N>.pt),
/// inside an epoch every N optimizer steps or every S seconds and when the ranks agreed to stop
/// (snapshot_epoch<E>_batch<B>.pt), and at start-up the newest one (or a given one) to continue
/// from. Built on save_snapshot / load_snapshot (snapshot.h: the file format, 3).
///
/// A loop hands it to a StepBoundary (step_boundary.h), which calls it at every step boundary and
/// says where each epoch starts after resume():
///
///   ddp::StepBoundary boundary(group, ddp::Checkpointer(group, *net, optimizer, options,
///   {&schedule}));
///   ... boundary.resume(), boundary.start_epoch(), boundary.at_step() ...
///   boundary.checkpointer().save_epoch(epoch, step);                 // at every epoch end
///
/// What a snapshot holds: the model and the optimizer (or any number of named ones: SnapshotParts,
/// snapshot.h), the position (the epoch, its batches done,
/// which is the sampler's position, the global step, and the samples of the epoch's order
/// trained, with which it resumes inside an epoch on another number of ranks: snapshot.h), the
/// data order's seed, the world size and the per-rank batch size, every rank's CPU generator, and
/// inside an epoch every rank's RankState: a generator of the caller's (the Trainer's augmentation,
/// an autoencoder's noise) and the epoch's sums so far (EpochMeter::state). TrainingExtras adds a
/// per-step LRSchedule and a GradScaler. Everything else random in an epoch must be a function of
/// (seed, epoch, rank): then a resumed run ends bit-identical to an uninterrupted one on the CPU.
///
/// Snapshots every S seconds (every_seconds): each rank's clock says when S seconds have passed
/// since the newest snapshot ended (or resume()), but the ranks' clocks differ and a snapshot is
/// collective, so the ranks agree on it: StepBoundary sends time_due() on the stop check's
/// all-reduce (no message of its own) and hands the agreed answer to at_boundary. Timed snapshots
/// fall on the boundary after a stop check.
/// cost() sums the wall time of the snapshots written (rank 0's is what the summary shows).
///
/// State: the options, references to what it saves (which must outlive it), the step and time of
/// the newest snapshot written or resumed from, the snapshots' cost so far. Invariants: every rank
/// makes the same calls in the same order (they are collective: every rank's state is gathered,
/// rank 0 writes); only rank 0 touches the directory; only the newest snapshot inside an epoch is
/// kept, and an epoch-end snapshot removes those before it; `keep` epochs of epoch-end files are
/// kept.
///
/// A model whose parameters or buffers are not finite is never written (TrainingDiverged,
/// divergence.h), so a diverged run cannot replace or rotate out the good files.
///
/// At construction (rank 0): the directory is created if missing and checked writable, so that
/// a read-only or uncreatable directory is reported before any training; rank 0 takes the
/// directory's lock (`<dir>/.ddp.lock`, flock; held until the Checkpointer goes), so that a second
/// job on the same directory is refused naming the first (its host, pid, start, Slurm job), and a
/// lock left by a job that is gone is taken over, saying whose it was; then temporary files of
/// writes that a killed run left behind are removed (remove_stale_temporaries), each named.
/// docs/reliability.md says what flock does not cover (NFS and Lustre mounts without it).

#include <ddp/distributed_data_parallel.h>
#include <ddp/process_group.h>
#include <ddp/train/snapshot.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

namespace detail {
class DirectoryLock;  ///< internal (src/train/directory_lock.h): the directory's lock, rank 0's
class ReachedRecord;  ///< internal (src/train/reached_position.h): how far the run got, rank 0's
}  // namespace detail

/// What the Checkpointer writes, where, how often, and what it resumes from.
struct CheckpointerOptions {
  /// Where snapshots and model_with_epoch<N>.pt go (rank 0 writes). Empty: nothing is written,
  /// and resume() can only take a path.
  std::string dir;
  int64_t keep = 3;  ///< newest epochs of epoch-end files kept; 0: keep all
  /// "": start fresh; "latest": the newest snapshot in `dir` (a fresh start when there is none);
  /// otherwise the path of a snapshot.
  std::string resume;
  /// With "latest": an unreadable newest snapshot is skipped for the one before it (with a
  /// warning) instead of being an error.
  bool fallback = false;
  /// Also a snapshot inside an epoch every N optimizer steps, for the crashes that give no
  /// warning; only the newest such file is kept. 0: at epoch ends and stops only.
  int64_t every_steps = 0;
  /// Also a snapshot inside an epoch once this many seconds have passed since the newest
  /// snapshot (or the start), agreed over the ranks (time_due); either trigger may come first.
  /// 0: none.
  double every_seconds = 0;
  /// The clock of every_seconds, in seconds (monotonic). Empty: std::chrono::steady_clock. Tests
  /// give a fake one, so that when a snapshot is due does not depend on the machine's speed.
  std::function<double()> clock;
  /// The data order's seed (the DistributedSampler's), saved so that a resumed run continues
  /// the same order: resume() returns the snapshot's, warning when it is not this one.
  int64_t seed = 0;
  /// The per-rank batch size, saved so that a run resumed at another world size can keep the
  /// global batch (TrainerOptions::keep_global_batch), and the samples a crash cost counted
  /// (reached_position.h). 0: not saved.
  int64_t batch_size = 0;
  /// What else shapes the trajectory, as the caller names it (the Trainer: accumulation, mixed
  /// precision, clipping): recorded in every snapshot with the optimizer's type and options and
  /// the comm hook, and compared at resume (resume() names each difference).
  Settings settings;
};

/// What resume() found.
struct ResumePoint {
  TrainingPosition position;  ///< where to continue: {1, 0, 0} on a fresh start
  std::string path;           ///< the snapshot read; empty on a fresh start
  int64_t seed = 0;           ///< the snapshot's data-order seed (the options' on a fresh start)
  /// Inside an epoch (position.batch > 0) at the same world size: this rank's RankState as
  /// saved, else empty (at another world size no rank's state is restored).
  RankState rank_state;
  ///@{
  /// The run that wrote the snapshot: its ranks and per-rank batch size (0: not recorded); 0 and
  /// 0 on a fresh start. position.samples is its samples_done (snapshot.h).
  int world_size = 0;
  int64_t batch_size = 0;
  ///@}

  bool resumed() const { return !path.empty(); }  ///< a snapshot was read (not a fresh start)
  /// The epochs the snapshot had finished (0 on a fresh start).
  int64_t epochs_done() const { return position.epoch - 1; }
};

/// The wall time the snapshots of a run took on this rank: each the whole collective save
/// (gathering the ranks' states, the write to a temporary file and its rename), epoch ends'
/// included.
struct SnapshotCost {
  int64_t written = 0;       ///< snapshots (step and epoch-end ones)
  int64_t at_epoch_end = 0;  ///< of them, at epoch ends
  double seconds = 0;        ///< their total
  double max_seconds = 0;    ///< the slowest
  double mean_seconds() const { return written ? seconds / written : 0.0; }  ///< 0 when none
};

/// Saves and resumes a run's whole training state (snapshot.h) in CheckpointerOptions::dir:
/// snapshots at epoch ends, inside epochs (every_steps, every_seconds) and at a stop, and the
/// model's weights at epoch ends; rotates the old files out. Each collective call is made on
/// every rank in the same order.
class Checkpointer {
 public:
  /// Collective only through its checks' failure (rank 0 checks the directory). Throws
  /// std::invalid_argument naming the CheckpointerOptions field for an option out of range or
  /// one that needs `dir`, and std::runtime_error naming CheckpointerOptions::dir when the
  /// directory cannot be created or written, or another job holds its lock ("CheckpointerOptions::
  /// dir: <dir> is in use by another job (host n1, pid 1234, since ... holds <dir>/.ddp.lock)").
  Checkpointer(ProcessGroup& group, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
               CheckpointerOptions options, TrainingExtras extras = {});
  /// The same for any number of named modules and optimizers (SnapshotParts, snapshot.h: a GAN's
  /// generator and discriminator with an optimizer each), saved and resumed together, each
  /// module's weights at an epoch end as `<name>_with_epoch<N>.pt`. Throws std::invalid_argument
  /// naming a part whose name is not valid (check_snapshot_parts).
  Checkpointer(ProcessGroup& group, SnapshotParts parts, CheckpointerOptions options,
               TrainingExtras extras = {});
  /// The same for the module `model` wraps, with the wrapper's own state too (its comm hook's
  /// state and bucket order: TrainingExtras::ddp). Pass the wrapper when training with it.
  Checkpointer(ProcessGroup& group, DistributedDataParallel& model,
               torch::optim::Optimizer& optimizer, CheckpointerOptions options,
               TrainingExtras extras = {});

  /// Collective. Loads the snapshot `resume` names (restoring the model, the optimizer, the
  /// extras and every rank's CPU generator; replaying `scheduler`, a per-epoch LibTorch
  /// scheduler, to the snapshot's epoch) and says where to continue; a fresh start when
  /// `resume` is empty, or "latest" finds none. Rank 0 prints what it resumed from (or that there
  /// was nothing), and warns when the seed differs, or the world size: then each rank's random
  /// generators and, inside an epoch, its RankState are not restored, and the rest of the epoch
  /// is re-sharded (the line says so: the epoch's metrics cover only its rest). It also warns,
  /// one line each, for every setting (Settings: the optimizer, the comm hook, the per-rank batch
  /// size, CheckpointerOptions::settings) that differs from the snapshot's run: the run goes on,
  /// but no longer on the trajectory the snapshot's run would have followed. Throws
  /// std::runtime_error naming the file when it cannot be read or does not fit the run
  /// (snapshot.h).
  ResumePoint resume(torch::optim::LRScheduler* scheduler = nullptr);

  /// Collective, at a step boundary: writes a step snapshot of `at` when `stopping`, or when
  /// steps were taken since the newest snapshot written or resumed from (or since step 0) and
  /// every_steps divides at.step or `time_due` (the ranks' agreed time_due(), which must be the
  /// same on every rank). Calls `rank_state` only then (empty: a loop with no per-rank state,
  /// as `{}` gives). Returns the path written; "" when none
  /// (or without a directory). Rank 0 also records `at` as how far the run got.
  std::string at_boundary(bool stopping, const TrainingPosition& at,
                          const std::function<RankState()>& rank_state, bool time_due = false);
  /// Whether at_boundary(false, at, ..., time_due) writes a snapshot. Local.
  bool due(const TrainingPosition& at, bool time_due) const;

  /// This rank's clock: every_seconds > 0 and they have passed since the newest snapshot ended
  /// (or since construction or resume()). Local; agree on it before at_boundary.
  bool time_due() const;
  /// The snapshots written so far, as this rank timed them.
  const SnapshotCost& cost() const { return cost_; }

  /// Collective: the snapshot inside epoch at.epoch after at.batch batches (without a directory,
  /// nothing). Removes older snapshots inside an epoch. Returns the path ("" without a directory).
  std::string save_step(const TrainingPosition& at, const RankState& rank_state);

  /// Collective: at the end of `epoch` after `step` optimizer steps, model_with_epoch<epoch>.pt
  /// (rank 0) and snapshot_epoch<epoch>.pt; then removes the snapshots inside epochs before it
  /// and the files of the epoch `keep` epochs back. Nothing without a directory.
  void save_epoch(int64_t epoch, int64_t step);

  /// As constructed, but for set_batch_size's change.
  const CheckpointerOptions& options() const { return options_; }
  /// The per-rank batch size saved from now on (CheckpointerOptions::batch_size): for a run that
  /// changed it on resuming (TrainerOptions::keep_global_batch).
  void set_batch_size(int64_t batch_size) { options_.batch_size = batch_size; }

 private:
  ProcessGroup& group_;
  SnapshotParts parts_;
  CheckpointerOptions options_;
  TrainingExtras extras_;
  Settings optimizer_settings_;  ///< each optimizer's type and options, as constructed
  bool created_dir_ = false;     ///< rank 0: the constructor created options_.dir
  int64_t last_step_ = 0;        ///< the step of the newest snapshot written or resumed from
  double last_time_ = 0;         ///< now() when it ended (or at construction, resume())
  SnapshotCost cost_;
  std::shared_ptr<detail::DirectoryLock> lock_;  ///< rank 0 with a dir, where flock works
  /// Rank 0 with a dir: <dir>/.ddp.reached, rewritten at every step boundary, so that the run
  /// resumed after a crash can say how much work the crash cost (reached_position.h).
  std::shared_ptr<detail::ReachedRecord> reached_;

  double now() const;  ///< options_.clock, else the steady clock
  /// What this run records in its snapshots: the optimizer, the comm hook, the caller's.
  Settings settings() const;
  /// Rank 0: a warning line for each of this run's settings that `saved` has otherwise.
  void say_changed_settings(const TrainingProgress& saved) const;
  /// The progress every snapshot records, at `at` (epoch: the epochs finished).
  TrainingProgress progress_at(int64_t epochs_done, int64_t batches_done, int64_t step,
                               int64_t samples_done) const;
  /// Times `save` (a collective save) into cost_ and restarts the timer.
  void timed(bool epoch_end, const std::function<void()>& save);
  void create_directory() const;
  /// The weights files of the end of `epoch`, one per module.
  std::vector<std::string> weights_paths(int64_t epoch) const;
  /// Throws TrainingDiverged (divergence.h) naming `path` and the tensor when a parameter or
  /// buffer of a module is not finite: a diverged model is never saved, nor rotates good files out.
  void refuse_nonfinite(const std::string& path, int64_t epoch, int64_t step) const;
  void remove_older_step_snapshots(const std::string& newest) const;
};

}  // namespace ddp

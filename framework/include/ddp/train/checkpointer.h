#pragma once
/// \file
/// Snapshots of a training run (snapshot.h: what they hold, the file format) and resuming from
/// them, for any loop: at every epoch end (snapshot_epoch<N>.pt, and the weights as
/// model_with_epoch<N>.pt), inside an epoch every N steps or S seconds and at a stop
/// (snapshot_epoch<E>_batch<B>.pt), and at the end of a run that stops inside an epoch (a step
/// budget: save_unfinished_epoch, the weights as model_at_step<S>.pt). A StepBoundary owns it and
/// calls it at every step boundary:
///
///   ddp::StepBoundary boundary(group, ddp::Checkpointer(group, *net, optimizer, options, {&lr}));
///   ... boundary.resume(), boundary.start_epoch(), boundary.at_step() ...
///   boundary.checkpointer().save_epoch(epoch, step);                 // at every epoch end
///
/// Everything random in an epoch must be in a snapshot (RankState) or a function of (seed, epoch,
/// rank): then a resumed run ends bit-identical to an uninterrupted one on the CPU. Timed
/// snapshots are agreed over the ranks: step_boundary.h.
///
/// Invariants: every rank makes the same calls in the same order (they are collective: every
/// rank's state is gathered, rank 0 writes); only rank 0 touches the directory; only the newest
/// snapshot inside an epoch is kept, and an epoch-end snapshot removes those before it; `keep`
/// epochs of epoch-end files are kept. A model whose parameters or buffers are not finite is never
/// written (TrainingDiverged), so a diverged run cannot rotate the good files out.
///
/// At construction rank 0 creates the directory if missing and checks that it is writable (so a
/// bad directory is reported before any training), takes its lock (`<dir>/.ddp.lock`, held while
/// the Checkpointer lives: src/train/directory_lock.h), and removes, naming each, the temporary
/// files a killed run left (remove_stale_temporaries).

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
  /// snapshot (or the start), agreed over the ranks (time_due). 0: none.
  double every_seconds = 0;
  /// every_seconds' monotonic clock, in seconds (tests give a fake one). Empty: steady_clock.
  std::function<double()> clock;
  /// The data order's seed (the DistributedSampler's), saved so that a resumed run continues
  /// the same order: resume() returns the snapshot's, warning when it is not this one.
  int64_t seed = 0;
  /// The per-rank batch size, saved for TrainerOptions::keep_global_batch and to count the
  /// samples a crash cost. 0: not saved.
  int64_t batch_size = 0;
  /// What else shapes the trajectory, as the caller names it: recorded in every snapshot with the
  /// optimizer's and the comm hook's, and compared at resume.
  Settings settings;
};

/// What resume() found.
struct ResumePoint {
  TrainingPosition position;  ///< where to continue: {1, 0, 0} on a fresh start
  std::string path;           ///< the snapshot read; empty on a fresh start
  int64_t seed = 0;           ///< the snapshot's data-order seed (the options' on a fresh start)
  /// Inside an epoch (position.batch > 0) at the same world size: this rank's RankState as
  /// saved, else empty.
  RankState rank_state;
  int world_size = 0;      ///< the snapshot's run's ranks; 0 on a fresh start
  int64_t batch_size = 0;  ///< its per-rank batch size; 0: not recorded, or a fresh start

  bool resumed() const { return !path.empty(); }  ///< a snapshot was read (not a fresh start)
  /// The epochs the snapshot had finished (0 on a fresh start).
  int64_t epochs_done() const { return position.epoch - 1; }
};

/// The wall time this rank spent in whole collective saves, epoch ends' included.
struct SnapshotCost {
  int64_t written = 0;       ///< snapshots (step and epoch-end ones)
  int64_t at_epoch_end = 0;  ///< of them, at epoch ends
  double seconds = 0;        ///< their total
  double max_seconds = 0;    ///< the slowest
  double mean_seconds() const { return written ? seconds / written : 0.0; }  ///< 0 when none
};

/// Saves and resumes a run's training state in CheckpointerOptions::dir (see the file's text).
class Checkpointer {
 public:
  /// Collective only through its checks' failure (rank 0 checks the directory). Throws
  /// std::invalid_argument naming the CheckpointerOptions field for an option out of range or
  /// one that needs `dir`, and std::runtime_error naming CheckpointerOptions::dir when the
  /// directory cannot be created or written, or another job holds its lock ("CheckpointerOptions::
  /// dir: <dir> is in use by another job (host n1, pid 1234, since ... holds <dir>/.ddp.lock)").
  Checkpointer(ProcessGroup& group, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
               CheckpointerOptions options, TrainingExtras extras = {});
  /// The same for named modules and optimizers (SnapshotParts: a GAN's generator and
  /// discriminator), each module's weights at an epoch end as `<name>_with_epoch<N>.pt`. Throws
  /// std::invalid_argument naming a part whose name is not valid (check_snapshot_parts).
  Checkpointer(ProcessGroup& group, SnapshotParts parts, CheckpointerOptions options,
               TrainingExtras extras = {});
  /// The same for the module `model` wraps. Either way the snapshots hold the wrappers' state
  /// too (their comm hooks' state and bucket order), found from the modules (snapshot.h).
  Checkpointer(ProcessGroup& group, DistributedDataParallel& model,
               torch::optim::Optimizer& optimizer, CheckpointerOptions options,
               TrainingExtras extras = {});

  /// Collective. Loads the snapshot `resume` names (replaying `scheduler`, a per-epoch LibTorch
  /// scheduler, whose rates the run keeps: snapshot.h) and says where to continue; a fresh start
  /// when `resume` is empty, or "latest" finds none. A fresh start too refuses, before any
  /// training, a wrapper whose comm hook state the snapshots could not hold (snapshot.h: register
  /// the hooks before resume() for this check to see them; saving checks again). Rank 0 says what
  /// it resumed from, and warns, one line each, when the seed, the world size (see snapshot.h) or a
  /// setting (Settings, the per-rank batch size) differs from the snapshot's run; the run goes on.
  /// Throws std::runtime_error naming the file when it cannot be read or does not fit the run
  /// (snapshot.h).
  ResumePoint resume(torch::optim::LRScheduler* scheduler = nullptr);

  /// Collective, at a step boundary: writes a step snapshot of `at` when `stopping`, or when
  /// steps were taken since the newest snapshot written or resumed from (or since step 0) and
  /// every_steps divides at.step or `time_due` (the ranks' agreed time_due(), which must be the
  /// same on every rank). Calls `rank_state` only then (`{}`: no per-rank state). Returns the
  /// path written, else "". Rank 0 also records `at` as how far the run got.
  std::string at_boundary(bool stopping, const TrainingPosition& at,
                          const std::function<RankState()>& rank_state, bool time_due = false);
  /// Whether at_boundary(false, at, ..., time_due) writes a snapshot. Local.
  bool due(const TrainingPosition& at, bool time_due) const;

  /// This rank's clock: every_seconds > 0 and they have passed since the newest snapshot ended
  /// (or since construction or resume()). Local; agree on it before at_boundary.
  bool time_due() const;
  /// The snapshots written so far, as this rank timed them.
  const SnapshotCost& cost() const { return cost_; }
  /// The snapshot this run wrote last (save_step or save_epoch); "" before any or without a dir.
  const std::string& last_written() const { return last_written_; }

  /// Collective: the snapshot inside epoch at.epoch after at.batch batches (without a directory,
  /// nothing). Removes older snapshots inside an epoch. Returns the path ("" without a directory).
  std::string save_step(const TrainingPosition& at, const RankState& rank_state);

  /// Collective: at the end of `epoch` after `step` optimizer steps, model_with_epoch<epoch>.pt
  /// (rank 0) and snapshot_epoch<epoch>.pt; then removes the snapshots inside epochs before it
  /// and the files of the epoch `keep` epochs back. Nothing without a directory. Only for an
  /// epoch trained to its end: the snapshot records it as finished, so a resume starts the next.
  void save_epoch(int64_t epoch, int64_t step);

  /// Collective: the end of a run that stops inside an epoch (a budget of optimizer steps), at
  /// `at` (StepBoundary::position() after at_step at the boundary where the budget is spent):
  /// the weights as model_at_step<at.step>.pt (rank 0; `<name>_at_step<S>.pt` per named module,
  /// not rotated) and the snapshot inside the epoch that save_step writes, from which a resume
  /// trains the epoch's rest. Returns the snapshot's path ("" without a directory). save_epoch
  /// instead would name an epoch never finished and make a resume skip its rest.
  std::string save_unfinished_epoch(const TrainingPosition& at, const RankState& rank_state);

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
  std::string last_written_;
  std::shared_ptr<detail::DirectoryLock> lock_;  ///< rank 0 with a dir, where flock works
  /// Rank 0 with a dir: how far the run got, for a resume after a crash (reached_position.h).
  std::shared_ptr<detail::ReachedRecord> reached_;

  double now() const;  ///< options_.clock, else the steady clock
  /// What this run records in its snapshots: the optimizer, the comm hook, the caller's.
  Settings settings() const;
  /// Rank 0: a warning line for each of this run's settings that `saved` has otherwise;
  /// `scheduled`: a schedule sets a learning rate.
  void say_changed_settings(const TrainingProgress& saved, bool scheduled) const;
  /// The progress every snapshot records, at `at` (epoch: the epochs finished).
  TrainingProgress progress_at(int64_t epochs_done, int64_t batches_done, int64_t step,
                               int64_t samples_done) const;
  /// Times `save` (a collective save) into cost_ and restarts the timer.
  void timed(bool epoch_end, const std::function<void()>& save);
  void create_directory() const;
  /// The weights files "<module>_<what><n>.pt", one per module: "with_epoch" at the end of
  /// epoch n, "at_step" after step n inside an epoch.
  std::vector<std::string> weights_paths(const char* what, int64_t n) const;
  /// Throws TrainingDiverged naming `path` and the tensor when a parameter or buffer is not finite.
  void refuse_nonfinite(const std::string& path, int64_t epoch, int64_t step) const;
  void remove_older_step_snapshots(const std::string& newest) const;
};

}  // namespace ddp

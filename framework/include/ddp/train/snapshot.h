#pragma once
/// \file
/// Training snapshots: everything a run needs to continue as if it had never stopped. On the CPU
/// a resumed run ends bit-identical to an uninterrupted one, from an epoch end or inside an epoch.
///
/// A snapshot holds the modules' parameters and buffers and the optimizers' state (one model, or
/// named SnapshotParts), the position (TrainingProgress), the seed, world size and per-rank batch
/// size, a description of the model (to refuse another model's snapshot), the run's Settings, and
/// every rank's CPU generator, CUDA generator (when the ranks compute on a GPU: what dropout draws
/// from) and, inside an epoch, RankState. The LibTorch scheduler is replayed (stepped once per
/// finished epoch before the optimizer state is loaded), which restores any scheduler whose rate
/// depends only on its step count and its base rates, and the rates it sets are kept over the
/// snapshot's: a run resumes on its own schedule, the snapshot's when nothing changed, this run's
/// after a changed schedule or base rate (with several optimizers, whose scheduler LibTorch does
/// not name, the rates are the snapshot's). The sampler's order is a function of (seed, epoch,
/// rank). TrainingExtras' LRSchedule and GradScaler are entries of their own: loading refuses a
/// file that lacks one the run has, or has one the run lacks, naming it, rather than silently
/// restart or drop it. The Settings are optional on load.
///
/// The DistributedDataParallel wrappers of the modules (of a module, or of a module inside one,
/// found from the module: the wrapper need not be given) are saved too: every rank's comm hook
/// state and bucket order (DistributedDataParallel::save_state), one entry per wrapper. Saving and
/// loading refuse, naming the wrapped module and its hook, a wrapper whose comm hook keeps state
/// (PowerSGD) but wraps a module the snapshot does not hold: a model left out of SnapshotParts,
/// or one that holds a saved module and more. A wrapper's state is optional on load: one that the
/// file lacks (an older file), or that cannot be restored (another hook, another world size), is
/// named in a warning from rank 0, and a stateful hook then starts afresh.
///
/// A device change on resume is allowed (the model and optimizer state do not depend on it): CPU
/// ranks ignore saved CUDA generator states, CUDA ranks resumed without them keep their own; rank 0
/// warns, naming the file, as the random draws no longer match an uninterrupted run. Saving fails
/// on every rank when some ranks compute on CUDA and others on the CPU.
///
/// At another world size, what is per rank (the generators, RankState, the comm hook's state) is
/// not restored, and the rest of an epoch is re-sharded (step_boundary.h).
///
/// File format 3: "DDPSNAP3", the payload's byte count and XXH64 hash (little-endian uint64 each),
/// then the payload, a LibTorch archive. The hash catches truncated and corrupted files, which
/// LibTorch's zip reader may not. Files are written atomically (write_atomically). Formats 1 and 2
/// are refused with a message saying so.

#include <ddp/communicator.h>
#include <ddp/train/grad_scaler.h>
#include <ddp/train/lr_schedule.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

/// What shaped a run's trajectory besides the model and the position, as (name, value) pairs: the
/// optimizer, the comm hook, the caller's own. Compared at resume (Checkpointer::resume).
using Settings = std::vector<std::pair<std::string, std::string>>;

/// Where a run stands, as a training loop counts (a snapshot records it as TrainingProgress).
/// `samples` is what re-sharding needs (step_boundary.h); -1: snapshots inside an epoch resume only
/// on as many ranks as wrote them.
struct TrainingPosition {
  int64_t epoch = 1;     ///< the epoch in progress, 1-based
  int64_t batch = 0;     ///< its batches trained: the next batch's index
  int64_t step = 0;      ///< optimizer steps taken in all
  int64_t samples = -1;  ///< the epoch's sample order trained by all ranks; -1: not said
};

/// A run's progress as a snapshot records it (TrainingPosition counts the same another way).
struct TrainingProgress {
  int64_t epoch = 0;        ///< epochs finished
  int64_t global_step = 0;  ///< optimizer steps taken
  int64_t seed = 0;         ///< the data order's (CheckpointerOptions::seed)
  int world_size = 1;       ///< of the run that wrote it
  /// Batches of epoch `epoch + 1` already trained: > 0 for a snapshot taken inside an epoch.
  int64_t batches_done = 0;
  int64_t batch_size = 0;  ///< per rank, of the run that wrote it; 0: not recorded
  /// Positions of epoch `epoch + 1`'s sample order trained by all ranks together (0 at an epoch
  /// end; -1: not recorded, see TrainingPosition::samples).
  int64_t samples_done = -1;
  Settings settings;  ///< empty: not recorded
};

/// What each rank holds inside an epoch that the others do not. Every rank's is saved; loading
/// gives each rank back its own. All ranks must hand in the same kinds and sizes.
struct RankState {
  torch::Tensor generator;  ///< a CPU generator's state (get_state()), or undefined for none
  torch::Tensor values;     ///< float64 [K], the caller's numbers, or undefined for none
};

/// Training state beyond the model and the optimizer; null: the run has none. The
/// DistributedDataParallel wrappers are not listed: a snapshot finds them from its modules.
struct TrainingExtras {
  LRSchedule* lr_schedule = nullptr;  ///< a per-step schedule: its position
  GradScaler* grad_scaler = nullptr;  ///< the fp16 loss scaler: its scale and growth count
};

/// The modules and optimizers a snapshot holds, each under its name: a name is letters, digits
/// and '_', unique among the modules (among the optimizers); one module and one optimizer named ""
/// are one model (the layout of a single model's snapshot). The pointers must outlive the use.
struct SnapshotParts {
  std::vector<std::pair<std::string, torch::nn::Module*>> modules;           ///< not owned
  std::vector<std::pair<std::string, torch::optim::Optimizer*>> optimizers;  ///< not owned
};

/// Throws std::invalid_argument naming `who` and the offending name unless `parts` has at least one
/// module and one optimizer, none null, and names as SnapshotParts says.
void check_snapshot_parts(const SnapshotParts& parts, const std::string& who);

/// "<dir>/snapshot_epoch<epoch>.pt": written at the end of `epoch`.
std::string snapshot_path(const std::string& dir, int64_t epoch);
/// "<dir>/snapshot_epoch<epoch>_batch<batches_done>.pt": written inside `epoch` (1-based, the
/// epoch in progress) after `batches_done` of its batches.
std::string snapshot_path(const std::string& dir, int64_t epoch, int64_t batches_done);

/// The snapshot files in `dir`, newest position first: an epoch end before the snapshots inside
/// that epoch, which come newest batch first, before the end of the previous epoch. Empty when
/// the directory does not exist.
std::vector<std::string> list_snapshots(const std::string& dir);

/// Collective over `comm` (gathers every rank's random generator states, CPU and, on a GPU,
/// CUDA, and `rank_state`; every rank calls optimizer.save(), collective for
/// ZeroRedundancyOptimizer); rank 0 writes `path`.
void save_snapshot(const std::string& path, Communicator& comm, const SnapshotParts& parts,
                   const TrainingProgress& progress, const RankState& rank_state = {},
                   const TrainingExtras& extras = {});

/// Collective: rank 0 reads `path` and broadcasts it, so the other ranks need not see the file.
/// Restores the model, replays `scheduler` (may be null), loads the optimizer state and `extras`,
/// and, at the same world size, this rank's generator states and `rank_state` (may be null; left
/// empty when the snapshot has none). Throws std::runtime_error naming the file on every rank when
/// it is missing, truncated, corrupted, of an older format, "written for a different model" or
/// optimizer (naming the first difference), or taken inside an epoch by another number of ranks
/// without samples_done; nothing is modified then.
TrainingProgress load_snapshot(const std::string& path, Communicator& comm,
                               const SnapshotParts& parts, torch::optim::LRScheduler* scheduler,
                               RankState* rank_state = nullptr, const TrainingExtras& extras = {});

}  // namespace ddp

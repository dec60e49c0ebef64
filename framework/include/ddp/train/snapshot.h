#pragma once
/// \file
/// Training snapshots: everything a run needs to continue as if it had never stopped. On the CPU
/// a run resumed from a snapshot ends bit-identical to an uninterrupted run, whether the
/// snapshot was written at an epoch end or inside an epoch (on a stop signal, or every N steps).
///
/// A snapshot holds the model's parameters and buffers, the optimizer's state (momentum buffers,
/// learning rates), the position (epochs finished, batches of the next epoch trained, global
/// step, and the samples of the epoch's order trained by all ranks together), the seed, the
/// world size and the per-rank batch size, a description of the model (names, shapes, dtypes) to
/// refuse a snapshot of another model, and for every rank: its CPU random generator state and,
/// inside an epoch, what the caller hands in as RankState (the Trainer's: its augmentation
/// generator and the epoch's metrics so far). The learning-rate schedule is its step count, the
/// epochs finished: the scheduler is replayed (stepped once per finished epoch before the optimizer
/// state is loaded), which restores any LibTorch scheduler whose rate depends only on its step
/// count. The sampler's order is a function of (seed, epoch, rank): the position is all it needs. A
/// per-step LRSchedule and a GradScaler (TrainingExtras) are saved as entries of their own
/// ("lr_schedule", "grad_scaler"; their position, base rates, scale and growth tracker) when the
/// caller has them: a file without them is still format 3, and loading refuses a file that lacks
/// one the run has, or has one the run lacks, naming it, rather than silently restart or drop it.
/// So is every rank's DistributedDataParallel state when the caller hands in the wrapper
/// ("ddp_states": the comm hook's state and the rebuilt bucket order), restored at the same world
/// size (at another only the bucket order: the hook's state is per rank, and a warning says it
/// starts afresh); and the run's Settings (the entry "settings"). Files without these two entries
/// still load.
///
/// CUDA generators: when the ranks compute on CUDA (the model's first parameter is on a GPU),
/// every rank's state of that device's default generator (what dropout on the GPU draws from) is
/// saved too, as the entry "cuda_generator_states", and restored on resume, so a mid-epoch resume
/// on a GPU is bit-identical as on the CPU. Runs on the CPU write no such entry, and files without
/// it (from CPU runs, or from an older ddp) still load. A device change on resume is allowed,
/// since the model and optimizer state do not depend on the device: a snapshot with the entry
/// loads on ranks that compute on the CPU (the CUDA states are ignored), and one without it on
/// ranks that compute on CUDA (their CUDA generators keep their state); rank 0 then prints a
/// warning naming the file, as the random draws can no longer match an uninterrupted run.
/// Saving fails on every rank when some ranks compute on CUDA and others on the CPU.
///
/// Another world size: a snapshot resumes on any number of ranks. The model, the optimizer, the
/// extras and the position are the same for every rank; what is per rank (the CPU and CUDA
/// generators, RankState) cannot be given to another count of ranks and is not restored (the
/// Checkpointer says so). Inside an epoch, the samples trained so far (TrainingProgress::
/// samples_done) say where the epoch's sample order continues: the DistributedSampler's start
/// (distributed_sampler.h), so the rest is re-sharded over the new ranks and every sample of the
/// epoch is still trained once. Files written before the samples were recorded (format 3 without
/// them) resume inside an epoch only on as many ranks as wrote them, and are refused otherwise.
///
/// More than one model: a snapshot holds any number of modules and optimizers, each under a name
/// (SnapshotParts: a GAN's "generator" and "discriminator" with an optimizer each), in the same
/// entries as one model: "model" and "optimizer" then hold an archive per name, and the model
/// description and optimizer type name each part. A snapshot loads only into the same parts (the
/// same names, shapes and optimizer types): otherwise it is refused as "written for a different
/// model" or optimizer, naming the first difference, and nothing is modified. One module and one
/// optimizer named "" are the one-model snapshot, whose entries are unchanged.
///
/// File format 3: "DDPSNAP3", the payload's byte count and XXH64 hash (little-endian uint64
/// each), then the payload, a LibTorch archive. The hash catches truncated and corrupted files,
/// which LibTorch's zip reader may not. Files are written atomically (write_atomically). Formats
/// 1 and 2 (no position inside an epoch) are refused with a message saying so.

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

class DistributedDataParallel;  ///< distributed_data_parallel.h

/// What shaped a run's trajectory besides the model and the position, as (name, value) pairs in
/// the order recorded: the optimizer's type and options, the comm hook, the caller's own (the
/// Trainer's accumulation, mixed precision, clipping). A snapshot records its run's; a resume
/// compares them with its own and names each difference (Checkpointer::resume).
using Settings = std::vector<std::pair<std::string, std::string>>;

/// Where a run stands, as a training loop counts: the epoch in progress (1-based), the batches of
/// it trained (the sampler's position: batch `batch` is the next one), the optimizer steps taken
/// in all, and the positions of the epoch's sample order trained by all ranks together (with
/// DistributedSampler shards and batches in order: batch x world size x per-rank batch size, plus
/// the sampler's start in an epoch resumed at another world size; -1: the loop does not say, and
/// its snapshots inside an epoch resume only on as many ranks as wrote them). (A snapshot records
/// it as TrainingProgress: epochs finished, batches_done, samples_done.)
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
  /// The data order's seed (CheckpointerOptions::seed).
  int64_t seed = 0;
  int world_size = 1;  ///< of the run that wrote it
  /// Batches of epoch `epoch + 1` already trained: > 0 for a snapshot taken inside an epoch.
  int64_t batches_done = 0;
  /// Per rank, of the run that wrote it; 0: not recorded (an older file, or a caller that did
  /// not say: CheckpointerOptions::batch_size).
  int64_t batch_size = 0;
  /// Positions of epoch `epoch + 1`'s sample order (its DistributedSampler permutation) trained
  /// by all ranks together: where the epoch continues on any number of ranks. 0 at an epoch
  /// end; -1: not recorded (an older file, or a loop that did not say), and then a snapshot
  /// inside an epoch resumes only on as many ranks as wrote it.
  int64_t samples_done = -1;
  /// The run's settings (Settings above); empty: not recorded (an older file).
  Settings settings;
};

/// What each rank holds inside an epoch that the others do not. Every rank's is saved; loading
/// gives each rank back its own. All ranks must hand in the same kinds and sizes.
struct RankState {
  torch::Tensor generator;  ///< a CPU generator's state (get_state()), or undefined for none
  torch::Tensor values;     ///< float64 [K], the caller's numbers, or undefined for none
};

/// Training state beyond the model and the optimizer; null: the run has none.
struct TrainingExtras {
  LRSchedule* lr_schedule = nullptr;  ///< a per-step schedule: its position
  GradScaler* grad_scaler = nullptr;  ///< the fp16 loss scaler: its scale and growth count
  /// The wrapper around the model: its comm hook's state (PowerSGD's error feedback and
  /// matrices, per rank) and its rebuilt bucket order (DistributedDataParallel::save_state), for
  /// every rank. Without it a stateful hook restarts from scratch on resume.
  DistributedDataParallel* ddp = nullptr;
};

/// The modules and optimizers a snapshot holds, each under its name: a name is letters, digits
/// and '_', unique among the modules (among the optimizers); one module and one optimizer named ""
/// are one model (the layout of a single model's snapshot). The pointers must outlive the use.
struct SnapshotParts {
  std::vector<std::pair<std::string, torch::nn::Module*>> modules;  ///< (name, module), not owned
  /// (name, optimizer), not owned.
  std::vector<std::pair<std::string, torch::optim::Optimizer*>> optimizers;
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
/// and restores this rank's random generator states (CPU, and CUDA where both the snapshot and the
/// rank have one) and `rank_state` (may be null; left empty when the snapshot has none) when the
/// world size is the same. Throws std::runtime_error naming the
/// file on every rank when it is missing, truncated, corrupted, of an older format, written for
/// another model or optimizer, or taken inside an epoch by another number of ranks without
/// recording its samples_done; nothing is modified then.
TrainingProgress load_snapshot(const std::string& path, Communicator& comm,
                               const SnapshotParts& parts, torch::optim::LRScheduler* scheduler,
                               RankState* rank_state = nullptr, const TrainingExtras& extras = {});

}  // namespace ddp

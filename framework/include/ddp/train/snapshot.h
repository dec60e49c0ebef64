#pragma once
// Training snapshots: everything a run needs to continue as if it had never stopped. On the CPU
// a run resumed from the snapshot of epoch k ends bit-identical to an uninterrupted run.
//
// A snapshot holds the model's parameters and buffers, the optimizer's state (momentum buffers,
// learning rates), the epoch and global step, the seed, the world size, a description of the
// model (names, shapes, dtypes) to refuse a snapshot of another model, and every rank's CPU
// random generator state. The learning-rate scheduler is not stored: it is replayed (stepped
// once per finished epoch before the optimizer state is loaded), which restores any LibTorch
// scheduler whose rate depends only on its step count. The sampler's order and the
// augmentation draws are functions of (seed, epoch, rank), so they need no state.
//
// File format: "DDPSNAP2", the payload's byte count and XXH64 hash (little-endian
// uint64 each), then the payload, a LibTorch archive. The hash catches truncated and corrupted
// files, which LibTorch's zip reader may not. Files are written atomically (write_atomically).

#include <ddp/comm/communicator.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct TrainingProgress {
  int64_t epoch = 0;        // epochs finished
  int64_t global_step = 0;  // optimizer steps taken
  int64_t seed = 0;
  int world_size = 1;       // of the run that wrote it
};

// "<dir>/snapshot_epoch<epoch>.pt"
std::string snapshot_path(const std::string& dir, int64_t epoch);

// The snapshot files in `dir` (snapshot_epoch<N>.pt), highest epoch first; empty when the
// directory does not exist.
std::vector<std::string> list_snapshots(const std::string& dir);

// Collective over `comm` (gathers every rank's random generator state); rank 0 writes `path`.
void save_snapshot(const std::string& path, Communicator& comm, const torch::nn::Module& model,
                   const torch::optim::Optimizer& optimizer, const TrainingProgress& progress);

// Collective: rank 0 reads `path` and broadcasts it, so the other ranks need not see the file.
// Restores the model, replays `scheduler` (may be null) and loads the optimizer state, and
// restores this rank's random generator state when the world size is the same. Throws
// std::runtime_error naming the file on every rank when it is missing, truncated, corrupted,
// or written for another model or optimizer; nothing is modified then.
TrainingProgress load_snapshot(const std::string& path, Communicator& comm,
                               torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                               torch::optim::LRScheduler* scheduler);

}  // namespace ddp

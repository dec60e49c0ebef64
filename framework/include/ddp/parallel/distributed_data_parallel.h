#pragma once
// Data-parallel training of any torch::nn::Module: every rank holds a full replica, computes
// gradients on its own shard of the batch, and after loss.backward() returns every parameter's
// grad() holds the average over all ranks. No extra call is needed in the training loop.
//
// Construction (collective): verifies that every rank has the same parameters and buffers
// (names, shapes, dtypes; the first mismatch is reported on every rank), picks the backend
// (DDPOptions::backend; Auto: NCCL for a model on the rank's GPU, MPI otherwise; the same on
// every rank), broadcasts parameters and buffers from rank 0 with it so all replicas start
// identical, and, with more than one rank, sets up the Reducer (reducer.h) that all-reduces
// gradients in buckets while backward runs.
//
// Invariant: every rank runs the same number of synchronised backward passes; no_sync() must be
// used identically on every rank.

#include <ddp/comm/communicator.h>
#include <ddp/parallel/ddp_options.h>
#include <ddp/parallel/process_group.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ddp {

class Reducer;  // parallel/reducer.h (internal)

class DistributedDataParallel {
 public:
  DistributedDataParallel(ProcessGroup& group, std::shared_ptr<torch::nn::Module> module,
                          DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() const { return *module_; }
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }
  // As given, with the backend resolved (Mpi or Nccl, never Auto).
  const DDPOptions& options() const { return options_; }

  // While the guard lives, backward accumulates gradients locally without communication; the
  // first backward after it averages everything accumulated (PyTorch's no_sync()).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), was_enabled_(ddp.sync_enabled()) {
      ddp_.set_sync_enabled(false);
    }
    ~NoSync() { ddp_.set_sync_enabled(was_enabled_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool was_enabled_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  // false: backward accumulates locally, without communication (what NoSync does).
  void set_sync_enabled(bool enabled);
  bool sync_enabled() const;

  // Call before each training forward (the Trainer does), as PyTorch's DDP does this work at
  // the start of its forward. Collective. With more than one rank:
  //  - with options().broadcast_buffers, overwrites every buffer with rank 0's (one broadcast
  //    per buffer dtype), so BatchNorm statistics stay identical;
  //  - re-attaches the gradient hooks of parameters whose storage was swapped since the last
  //    step (torch::load(model, ...) does that; ddp::load_module copies instead), which would
  //    otherwise silently stop the averaging.
  void prepare_forward();

  // Wall time the training thread spent on gradient sync that backward did not hide, and the
  // bytes all-reduced, since construction (0 with one rank: nothing to synchronise).
  double sync_seconds() const;
  int64_t sync_bytes() const;

  // The reducer's buckets (parameter indices in registration order); empty with one rank.
  std::vector<std::vector<size_t>> bucket_layout() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  DDPOptions options_;
  int world_size_;
  // Checks and the reducer's small exchanges, on an MPI communicator of their own.
  std::unique_ptr<Communicator> control_comm_;
  // The chosen backend's: the group's NCCL communicator, or owned_comm_ (MPI). It broadcasts
  // parameters and buffers and all-reduces the gradient buckets, in one queue.
  Communicator* comm_ = nullptr;
  std::unique_ptr<Communicator> owned_comm_;
  std::unique_ptr<Reducer> reducer_;  // destroyed first: it uses the communicators
};

}  // namespace ddp

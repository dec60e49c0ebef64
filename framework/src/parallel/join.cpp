// DistributedDataParallel::Join (distributed_data_parallel.h): uneven inputs. Every step the
// ranks meet in count_training's all-reduce (element r: rank r trains; element W: the training
// ranks whose backward synchronises); a finished rank then issues that step's collectives (the
// buffer broadcast, Reducer::shadow_backward), so every rank makes the same ones in order.
#include <ddp/distributed_data_parallel.h>

#include "parallel/reducer.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace ddp {

DistributedDataParallel::Join::Join(DistributedDataParallel& ddp) : ddp_(ddp) {
  if (ddp_.join_) {
    throw std::logic_error("DistributedDataParallel::join: a Join guard is attached already");
  }
  ddp_.join_ = this;
}

DistributedDataParallel::Join::~Join() {
  // No collective here: a guard left by an exception must not wait for the other ranks.
  if (ddp_.join_ == this) detach();
}

void DistributedDataParallel::Join::detach() {
  ddp_.join_ = nullptr;
  ddp_.buffer_root_ = 0;
  if (ddp_.reducer_) {
    ddp_.reducer_->set_training_ranks(ddp_.world_size_);
    ddp_.reducer_->set_forward_sync(std::nullopt);
  }
}

DistributedDataParallel::JoinCount DistributedDataParallel::count_training(bool training) {
  const int w = world_size_;
  torch::Tensor flags = torch::zeros({w + 1}, torch::kLong);
  if (training) {
    flags[control_comm_->rank()] = 1;
    flags[w] = sync_enabled() ? 1 : 0;
  }
  control_comm_->all_reduce(flags);
  const auto f = flags.accessor<int64_t, 1>();
  JoinCount count;
  for (int r = 0; r < w; ++r) {
    if (f[r] == 0) continue;
    ++count.training;
    last_trainer_ = r;
  }
  if (count.training == 0) return count;
  if (f[w] != 0 && f[w] != count.training) {
    throw std::runtime_error(
        "DistributedDataParallel::Join: " + std::to_string(f[w]) + " of the " +
        std::to_string(count.training) +
        " ranks still training synchronise this step's backward, "
        "the others are inside no_sync(): use no_sync() on every rank or none");
  }
  count.sync = f[w] != 0;
  if (reducer_ && training) reducer_->set_forward_sync(count.sync);
  // PyTorch's rule under join: the buffers of the highest rank still training.
  buffer_root_ = last_trainer_;
  if (reducer_) reducer_->set_training_ranks(count.training);
  return count;
}

void DistributedDataParallel::Join::finish() {
  if (finished_) throw std::logic_error("DistributedDataParallel::Join::finish: called twice");
  if (ddp_.join_ != this) throw std::logic_error("DistributedDataParallel::Join::finish: detached");
  finished_ = true;
  for (;;) {
    const JoinCount count = ddp_.count_training(false);
    if (count.training == 0) break;
    ++shadowed_;
    ddp_.broadcast_buffers();  // the training ranks' forward
    if (count.sync && ddp_.reducer_) ddp_.reducer_->shadow_backward();
  }
  // The finished ranks stopped stepping: every rank takes the model of the highest rank that
  // trained in the last step (PyTorch's _sync_final_model).
  ddp_.broadcast_model(ddp_.last_trainer_);
  detach();
}

}  // namespace ddp

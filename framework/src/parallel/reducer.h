#pragma once
// The gradient reducer behind DistributedDataParallel (the design of c10d's Reducer).
//
// Buckets: assign_buckets (bucketing.h) groups the parameters that require grad into flat
// one-dtype buckets in reverse registration order, a guess at the order of the gradients; with
// rebuild_buckets, step 5 regroups them once in the order they actually arrived on rank 0.
//
// One backward pass:
//   1. A post-hook on each grad accumulator copies the gradient into its bucket.
//   2. A full bucket goes to the comm hook (comm_hook.h), strictly in bucket order on every rank,
//      so every rank issues the same collectives in the same order; it is reduced while backward
//      computes earlier layers.
//   3. At the end of backward (an engine callback): missing gradients are zero-filled and their
//      buckets launched; the futures are waited for in bucket order (with NCCL the current
//      stream waits, not the host; hook_then_optimizer steps inside this wait); the ranks
//      exchange which parameters got a gradient; the averages go into grad().
//   4. A parameter without a gradient on any rank is an error on every rank naming it and the
//      ranks, or, with find_unused_parameters, zero (unused on every rank: grad kept as it was).
//   5. Once, with rebuild_buckets, between 3 and 4: rank 0 broadcasts its hook order and every
//      rank regroups buckets_ and slots_ in it (rank 0's, so the collectives still match), then
//      the layout check runs again.
// The bucket holds the accumulated grad(), so gradient accumulation and no_sync() stay exact.
//
// gradient_as_bucket_view: grad() is its slot's view (a detach()ed alias, which zero_grad() may
// detach_()), so step 3 copies nothing; any other grad() is copied in at step 1 and replaced by
// the view. Before step 3 zero-fills a view, grad() gets a copy of its old value, kept if no rank
// used the parameter. Results are bit-identical to copying.
//
// Invariants: every rank has the same bucket layout; between backward passes no bucket is in
// flight and, with gradient_as_bucket_view, each parameter that got a gradient in the last
// synchronised one has its slot's view as grad(); params_ never changes; buckets_ and slots_
// change at most once (step 5, identically on all ranks).

#include <ddp/comm_hook.h>
#include <ddp/communicator.h>
#include <ddp/distributed_data_parallel.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

class Reducer {
 public:
  // `params` and `names` in registration order, on one device `data` can reach. `data` reduces
  // the buckets; `control` (CPU) the reducer's own small exchanges, apart from bucket traffic.
  // Both outlive the Reducer. Collective (checks the bucket layout across ranks).
  Reducer(Communicator& data, Communicator& control, std::vector<torch::Tensor> params,
          std::vector<std::string> names, DDPOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // false: backward accumulates locally, no communication (no_sync()).
  void set_sync_enabled(bool enabled) { sync_enabled_ = enabled; }
  bool sync_enabled() const { return sync_enabled_; }
  // Under DistributedDataParallel::join(), each training forward tells the other ranks whether
  // its backward synchronises (no_sync() as it is then), and the backward keeps to that whatever
  // no_sync() says by then (PyTorch's rule), warning once when they differ. nullopt (no join):
  // no_sync() at the backward decides.
  void set_forward_sync(std::optional<bool> sync) { forward_sync_ = sync; }

  // Since construction: wall time the training thread waited for buckets at the end of backward
  // (with NCCL only the host's share) and bytes all-reduced.
  double sync_seconds() const { return sync_seconds_; }
  int64_t sync_bytes() const { return sync_bytes_; }

  // Replaces the comm hook (the default: allreduce_hook()). Only before the first synchronised
  // backward; std::logic_error otherwise.
  void set_comm_hook(CommHook hook);

  // How many ranks' gradients the buckets sum (GradBucket::training_ranks): the world size, fewer
  // under DistributedDataParallel::Join while some ranks have run out of data.
  void set_training_ranks(int ranks) { training_ranks_ = ranks; }

  // A synchronised backward without gradients, for a rank out of data under Join: every bucket
  // goes to the hook with zeros and steps 3-5 run, so this rank issues the training ranks'
  // collectives. It counts as having used every parameter (none with find_unused_parameters).
  void shadow_backward();

  // Parameter indices (registration order) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_layout() const;
  // The comm hook in use (the default until set_comm_hook).
  const CommHook& comm_hook() const { return hook_; }

  // The order step 5 regrouped the buckets in, once it has run; empty before. Snapshots keep it:
  // a resumed run must bucket alike, since a hook's state (PowerSGD's) is per bucket.
  const std::vector<size_t>& rebuilt_order() const { return rebuilt_order_; }
  // Regroups the buckets in `order` (a rebuilt_order()) as step 5 would; step 5 then does not
  // run. Collective; nothing when the buckets are in `order` already (rebuilt_order()); else
  // std::logic_error after the first synchronised backward, and std::invalid_argument when
  // `order` does not list exactly the bucketed parameters.
  void restore_order(const std::vector<size_t>& order);

  // Re-registers the hook of every parameter whose grad accumulator autograd has replaced
  // (Module::load, set_()): the old hook would never fire and averaging would silently stop.
  // Local. Returns the number of hooks re-attached.
  size_t reattach_hooks();

 private:
  struct Bucket {
    std::vector<size_t> params;
    torch::Tensor data;                  // flat gradients of `params`, in that order
    size_t pending = 0;                  // gradients not yet copied in during this backward
    std::optional<BucketFuture> future;  // the hook's, from its launch until finish_backward
  };
  struct Slot {  // where a parameter's gradient lives
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket
    bool ready = false;  // copied in during this backward
    torch::Tensor view;  // bucket data [offset, offset + numel), shaped like the parameter
  };

  // Groups `order` (the indices of the parameters that require grad) into buckets_, in that
  // order, and points slots_ at them.
  void build_buckets(const std::vector<size_t>& order);
  void rebuild_buckets();  // step 5
  void check_layout_across_ranks();
  // Whether this backward synchronises (set_forward_sync).
  bool backward_syncs();
  void on_gradient_ready(size_t param);
  void begin_backward();
  void start_pass();  // begin_backward() without the autograd callback
  // Steps 1-5; `shadow`: this rank produced no gradient on purpose (shadow_backward()).
  void finish_backward(bool shadow = false);
  void launch_ready_buckets();
  void wait_for_buckets();
  // Whether params_[param].grad() is its slot's view (gradient_as_bucket_view).
  bool grad_is_view(size_t param) const;
  // Step 3 for one parameter: its slot's average into grad().
  void hand_average(size_t param);

  Communicator& data_comm_;
  Communicator& control_comm_;
  DDPOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;  // per parameter; buckets_.size() for frozen ones

  // The accumulators are held so autograd does not recreate them (and drop the hooks). NodePtr:
  // whatever grad_accumulator returns (its type differs between LibTorch versions).
  using NodePtr =
      decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));
  struct Hook {
    size_t param;
    NodePtr accumulator;
    uintptr_t key;
  };
  void attach_hook(size_t param);
  std::vector<Hook> hooks_;

  CommHook hook_;
  bool sync_enabled_ = true;
  std::optional<bool> forward_sync_;
  bool warned_guard_after_forward_ = false;
  bool in_backward_ = false;
  bool synced_once_ = false;           // a synchronised backward has begun (the hook is fixed)
  bool rebuild_pending_ = false;       // until step 5 has run
  std::vector<size_t> ready_order_;    // parameters in hook order, while rebuild_pending_
  std::vector<size_t> rebuilt_order_;  // the order of step 5, once it has run
  size_t next_to_launch_ = 0;
  int training_ranks_;
  double sync_seconds_ = 0;
  int64_t sync_bytes_ = 0;
};

}  // namespace ddp

#pragma once
// The gradient reducer behind DistributedDataParallel (the design of PyTorch's c10d Reducer,
// over MPI or NCCL).
//
// Buckets: the parameters that require grad are grouped, in reverse registration order (the
// order backward produces their gradients), into flat buckets of one dtype by assign_buckets
// (bucketing.h), with the caps first_bucket_mb and bucket_cap_mb (a cap below every parameter's
// size gives each its own bucket: the same code path, other caps). Reverse registration order is
// only a guess at the order of the gradients: with rebuild_buckets, the first synchronised
// backward records the order they actually arrive in, and the buckets are regrouped, by the
// same rules, in rank 0's order (step 5).
//
// One backward pass:
//   1. When autograd has accumulated a parameter's gradient (a post-hook on its grad
//      accumulator), the gradient is copied into its bucket.
//   2. A bucket whose gradients are all in is launched, strictly in bucket order on every rank,
//      so every rank issues the same collectives in the same order: data.all_reduce_async()
//      returns at once and the backend reduces the bucket while backward computes earlier
//      layers (MPI on its worker thread, NCCL on its stream).
//   3. At the end of backward (an autograd engine callback): gradients that never came are
//      zero-filled and their buckets launched; the reducer waits for every bucket's Work, then
//      the ranks exchange which parameters got a gradient (over the control communicator, so it
//      cannot be confused with bucket traffic), and the averages are copied back into grad().
//      loss.backward() returns only then. With NCCL, waiting means that LibTorch's current
//      stream waits for each bucket, not the host: the copies into grad() and the optimizer step
//      queued after them run after the all-reduces, and the host runs ahead.
//   4. A parameter without a gradient on any rank is an error raised on every rank, naming the
//      parameters and ranks (find_unused_parameters=false), or counts as zero
//      (find_unused_parameters=true; a parameter unused on every rank keeps its grad as it was).
//   5. Once, at the end of the first synchronised backward with rebuild_buckets, between 3 and
//      4: rank 0 broadcasts the order in which its hooks fired (over the control communicator),
//      followed by the parameters it got no gradient for in reverse registration order; every
//      rank regroups buckets_ and slots_ in that order and the layout check runs again. Rank 0's
//      order, not each rank's own: a rank whose gradients arrive in another order must still
//      launch the same collectives in the same order.
//
// Averaging is the comm hook's (comm_hook.h): in step 2 the bucket, holding this rank's
// gradients, is handed to the hook, which starts its reduction and returns a BucketFuture; in step
// 3 the futures are waited for in bucket order and a result that is not the bucket itself is
// copied in. The default, allreduce_hook(), divides by the world size and sums over ranks.
// Because the bucket holds the accumulated grad(), gradient accumulation and no_sync() stay
// exact.
//
// Gradient as bucket view (DDPOptions::gradient_as_bucket_view, c10d's): grad() is the bucket's
// view itself, so backward accumulates into the bucket, step 1 finds the gradient in place and
// step 3 has nothing to copy. A grad() that is not the view (the first backward, after
// zero_grad() with set_to_none, or any tensor a user assigned) is copied in at step 1 as without
// the option and then replaced by the view. The views are plain aliases (detach()ed), not
// autograd views, so LibTorch's zero_grad() may detach_() them. Where the bucket must send zero
// for a parameter that has no gradient on this rank (step 3's zero-fill) while its grad() is the
// view, grad() first gets a copy of its old value: it keeps it if no rank used the parameter, as
// without the option. The rebuild (step 5) copies every defined grad() into the new buckets and
// points it there. Results are bit-identical to copying.
//
// The reducer knows no optimizer: a hook that steps one (hook_then_optimizer) does it in its
// future's continuation, inside step 3's wait, bucket by bucket.
//
// Invariants: every rank has the same bucket layout (checked at construction and after the
// rebuild); between backward passes no bucket is in flight; params_ never changes after
// construction; buckets_ and slots_ change at most once, in step 5, identically on all ranks,
// with nothing in flight. With gradient_as_bucket_view, between backward passes the grad() of
// every parameter that got a gradient in the last synchronised one is its slot's view.

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
  // `params` and `names` in registration order, all on one device that `data` can reach.
  // `data` all-reduces the buckets; `control` (CPU tensors) carries the reducer's own small
  // exchanges, on a communicator of its own so they cannot be confused with bucket traffic.
  // Both outlive the Reducer. Collective (checks the bucket layout across ranks).
  Reducer(Communicator& data, Communicator& control, std::vector<torch::Tensor> params,
          std::vector<std::string> names, DDPOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // false: backward accumulates locally, no communication (no_sync()).
  void set_sync_enabled(bool enabled) { sync_enabled_ = enabled; }
  bool sync_enabled() const { return sync_enabled_; }

  // Wall time the training thread spent on gradient sync (waiting for the
  // buckets at the end of backward: the communication that was not overlapped), and bytes
  // all-reduced, since construction. With NCCL the host does not wait for the GPU, so the time
  // is only the host's share; the GPU's shows in the step time.
  double sync_seconds() const { return sync_seconds_; }
  int64_t sync_bytes() const { return sync_bytes_; }

  // Replaces the comm hook (the default: allreduce_hook()). Only before the first synchronised
  // backward; std::logic_error otherwise.
  void set_comm_hook(CommHook hook);

  // How many ranks' gradients the buckets sum (GradBucket::training_ranks): the world size, fewer
  // under DistributedDataParallel::Join while some ranks have run out of data.
  void set_training_ranks(int ranks) { training_ranks_ = ranks; }

  // A synchronised backward in which this rank produced no gradient, for a rank that has run out
  // of data while others train (DistributedDataParallel::Join): every bucket goes to the hook
  // with zeros, in order, and the rest of step 3 (and 4, 5) runs as after any backward, so this
  // rank issues the collectives the training ranks issue. This rank counts as having used every
  // parameter, unless find_unused_parameters (then as having used none). The averages land in
  // grad() as after a backward.
  void shadow_backward();

  // Parameter indices (registration order) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_layout() const;
  // The comm hook in use (the default until set_comm_hook).
  const CommHook& comm_hook() const { return hook_; }

  // The order step 5 regrouped the buckets in (rank 0's, the same on every rank), once it has
  // run; empty before (or without rebuild_buckets). A snapshot keeps it: a run resumed from one
  // must bucket as the run that wrote it did, since a comm hook's state (PowerSGD's) is per
  // bucket.
  const std::vector<size_t>& rebuilt_order() const { return rebuilt_order_; }
  // Regroups the buckets in `order` (a rebuilt_order() of a reducer over the same parameters) as
  // step 5 would have, which then does not run again. Collective (the layout check); before the
  // first synchronised backward only (std::logic_error after it); std::invalid_argument when
  // `order` does not list exactly the parameters that have buckets.
  void restore_order(const std::vector<size_t>& order);

  // Re-registers the gradient hook of every parameter whose grad accumulator autograd has
  // replaced since the hooks were registered: Module::load (torch::load) and set_() give a
  // parameter a new one, and the old hook would never fire again, so the replicas would stop
  // averaging without a word. Cheap (a pointer comparison per parameter); local. Returns the
  // number of hooks re-attached.
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

  // Hooks: the accumulators are held so autograd does not recreate them (and drop the hooks).
  // LibTorch's pointer to an autograd Node, whatever grad_accumulator returns: std::shared_ptr
  // in 1.13, c10::intrusive_ptr in 2.15.
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

// The backend for parameters on `params_device`, with Backend::Auto resolved: NCCL when they are
// on `rank_device` (Runtime::device()), a CUDA device, and `nccl_built`
// (nccl_communicator_built()); MPI otherwise. Throws std::invalid_argument naming
// DDPOptions::backend when `requested` is Nccl and that cannot work. Pure.
Backend resolve_backend(Backend requested, c10::Device params_device, c10::Device rank_device,
                        bool nccl_built);

}  // namespace ddp

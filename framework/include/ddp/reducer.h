#pragma once
// The gradient reducer behind DistributedDataParallel (the design of PyTorch's c10d Reducer,
// over MPI or NCCL).
//
// Buckets: the parameters that require grad are grouped, in reverse registration order (the
// order backward produces their gradients), into flat buckets of one dtype: the first up to
// first_bucket_mb, the others up to bucket_cap_mb; a parameter larger than the cap gets a bucket
// of its own. Unlike PyTorch, a parameter of at least first_bucket_mb also closes its bucket:
// it is worth an all-reduce of its own, and sharing a bucket with earlier layers would hold its
// all-reduce back until their gradients exist (the seed CNN's fc1.weight would wait for every
// convolution). GradSync::PerParameter is the same machinery with one parameter per bucket.
// Reverse registration order is only a guess at the order of the gradients: with
// rebuild_buckets (Bucketed mode), the first synchronised backward records the order they
// actually arrive in, and the buckets are regrouped, by the same rules, in rank 0's order
// (step 5).
//
// One backward pass:
//   1. When autograd has accumulated a parameter's gradient (a post-hook on its grad
//      accumulator), the gradient is copied into its bucket.
//   2. A bucket whose gradients are all in is launched, strictly in bucket order on every rank,
//      so every rank issues the same collectives in the same order. MPI: Bucketed mode hands it
//      to the communication thread (all-reduce while backward computes earlier layers),
//      PerParameter mode reduces it inline. NCCL: either mode queues the all-reduce on the NCCL
//      stream right from the hook; NCCL calls return at once, so no thread is needed.
//   3. At the end of backward (an autograd engine callback): gradients that never came are
//      zero-filled and their buckets launched; the reducer waits for every bucket, then the
//      ranks exchange which parameters got a gradient (over MPI on a separate control
//      communicator, so it cannot be confused with bucket traffic), and the averages are copied
//      back into grad(). loss.backward() returns only then. With NCCL "waits" means LibTorch's
//      current stream (the one backward was called on) waits for each bucket's end event, not
//      the host: the copies into grad() and the optimizer step queued after them on that stream
//      run after the all-reduces, and the host runs ahead.
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
// Averaging: each bucket is divided by the world size, then summed over ranks. Because the
// bucket holds the accumulated grad(), gradient accumulation and no_sync() stay exact.
//
// Backends: the backend-specific part is one seam. A bucket is prepared (divided, cast to the
// wire dtype), all-reduced, and completed (cast back). MPI runs the three back to back in
// reduce(), on the communication thread or inline; NCCL (an AsyncCommunicator) starts the
// all-reduce with all_reduce_async() in step 2 and waits for its Work in step 3.
//
// Invariants: every rank has the same bucket layout (checked at construction and after the
// rebuild); between backward passes no bucket is in flight; params_ never changes after
// construction; buckets_ and slots_ change at most once, in step 5, identically on all ranks,
// with nothing in flight.

#include <ddp/async_communicator.h>
#include <ddp/ddp_options.h>
#include <ddp/mpi_communicator.h>
#include <ddp/runtime.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ddp {

// The backend for parameters on `params_device`, with Backend::Auto resolved: NCCL when they are
// on `rank_device` (Runtime::device()), a CUDA device, and `nccl_built`
// (nccl_communicator_built()); MPI otherwise. Throws std::invalid_argument naming
// DDPOptions::backend when `requested` is Nccl and that cannot work. Pure.
Backend resolve_backend(Backend requested, torch::Device params_device, torch::Device rank_device,
                        bool nccl_built);

class Reducer {
 public:
  // `params` and `names` in registration order, all on one device. Collective (checks the
  // backend and bucket layout across ranks, duplicates MPI communicators; with NCCL, the first
  // use of Runtime::gpu_communicator() creates it).
  Reducer(Runtime& runtime, std::vector<torch::Tensor> params, std::vector<std::string> names,
          DDPOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // false: backward accumulates locally, no communication (no_sync()).
  void set_sync_enabled(bool enabled) { sync_enabled_ = enabled; }
  bool sync_enabled() const { return sync_enabled_; }

  // Wall time the training thread spent on gradient sync (inline reductions and waiting for
  // buckets at the end of backward: the communication that was not overlapped), and bytes
  // all-reduced, since construction. With NCCL the host does not wait for the GPU, so the time
  // is only the host's share; the GPU's shows in the step time.
  double sync_seconds() const { return sync_seconds_; }
  int64_t sync_bytes() const { return sync_bytes_; }

  // Parameter indices (registration order) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_layout() const;

  // The backend that all-reduces the buckets (Mpi or Nccl; never Auto).
  Backend backend() const { return options_.backend; }

  // Re-registers the gradient hook of every parameter whose grad accumulator autograd has
  // replaced since the hooks were registered: Module::load (torch::load) and set_() give a
  // parameter a new one, and the old hook would never fire again, so the replicas would stop
  // averaging without a word. Cheap (a pointer comparison per parameter); local. Returns the
  // number of hooks re-attached.
  size_t reattach_hooks();

 private:
  struct Bucket {
    std::vector<size_t> params;
    torch::Tensor data;   // flat gradients of `params`, in that order
    torch::Tensor wire;   // `data` in the compression dtype; undefined without compression
    size_t pending = 0;   // gradients not yet copied in during this backward
  };
  struct Slot {           // where a parameter's gradient lives
    size_t bucket = 0;
    int64_t offset = 0;   // elements into the bucket
    bool ready = false;   // copied in during this backward
  };

  // Groups `order` (the indices of the parameters that require grad) into buckets_, in that
  // order, and points slots_ at them.
  void build_buckets(const std::vector<size_t>& order);
  void rebuild_buckets();  // step 5
  void check_layout_across_ranks();
  void on_gradient_ready(size_t param);
  void begin_backward();
  void finish_backward();
  void launch_ready_buckets();
  torch::Tensor prepare(size_t bucket);  // divides; returns the tensor to all-reduce
  void complete(size_t bucket);          // copies the wire dtype back
  void reduce(size_t bucket);            // MPI: prepare, all-reduce, complete (thread or inline)
  void wait_for_buckets();
  void comm_thread_loop();
  torch::Tensor view_of(size_t param);

  Runtime& runtime_;
  DDPOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;          // per parameter; buckets_.size() for frozen ones
  MpiCommunicator control_comm_;     // the end-of-backward exchange (and start-up checks) only
  std::unique_ptr<MpiCommunicator> mpi_data_comm_;  // MPI: bucket all-reduces only
  AsyncCommunicator* async_comm_ = nullptr;         // NCCL: the runtime's GPU communicator
  Communicator* data_comm_ = nullptr;               // whichever of the two reduces buckets
  std::vector<std::unique_ptr<Work>> in_flight_;    // NCCL: per bucket, during backward

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

  bool sync_enabled_ = true;
  bool in_backward_ = false;
  bool rebuild_pending_ = false;     // until step 5 has run
  std::vector<size_t> ready_order_;  // parameters in hook order, while rebuild_pending_
  size_t next_to_launch_ = 0;
  double sync_seconds_ = 0;
  int64_t sync_bytes_ = 0;

  // Communication thread (MPI, Bucketed mode): a queue of launched buckets.
  std::thread comm_thread_;
  std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  std::deque<size_t> queue_;
  size_t completed_ = 0;             // buckets reduced in this backward
  bool stopping_ = false;
  std::exception_ptr comm_error_;
};

}  // namespace ddp

#pragma once
/// \file
/// Data-parallel training of any torch::nn::Module: every rank holds a full replica, computes
/// gradients on its own shard of the batch, and after loss.backward() returns every parameter's
/// grad() holds the average over all ranks. No extra call is needed in the training loop:
///
///   ddp::DistributedDataParallel model(group, net);   // net: std::shared_ptr<MyNet>
///   torch::Tensor loss = loss_fn(model(inputs), targets);   // forward through the wrapper
///   loss.backward();                                        // gradients averaged
///   optimizer.step();
///
/// The forward through the wrapper (forward(), operator()) does the pre-forward work PyTorch's DDP
/// does in its forward: re-attaching the gradient hooks after torch::load, and broadcasting rank
/// 0's buffers. Calling the module directly (net->forward(x)) still averages the gradients: the
/// hooks sit on the parameters, not on the wrapper. What is then lost: the buffer broadcast
/// (BatchNorm running statistics drift apart between replicas) and the re-attaching of hooks after
/// torch::load (ddp::load_module copies in place and keeps them). Both make the replicas differ,
/// which replica_check.h (the Trainer's TrainerOptions::check_sync_every, the examples'
/// --check-sync-every) detects, naming the first differing tensor.
///
/// Construction (collective): verifies that every rank has the same parameters and buffers
/// (names, shapes, dtypes; the first mismatch is reported on every rank), picks the backend
/// (DDPOptions::backend; Auto: NCCL for a model on the rank's GPU, MPI otherwise; the same on
/// every rank), broadcasts parameters and buffers from rank 0 with it so all replicas start
/// identical, and, with more than one rank (or with DDPOptions::reducer_at_one_rank), sets up the
/// Reducer (reducer.h) that all-reduces gradients in buckets while backward runs.
///
/// Invariant: every rank runs the same number of synchronised backward passes; no_sync() must be
/// used identically on every rank.

#include <ddp/comm_hook.h>
#include <ddp/communicator.h>
#include <ddp/process_group.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim
namespace torch::jit {
struct Module;  // torch/script.h: a TorchScript model (torch::jit::load)
}  // namespace torch::jit

namespace ddp {

class Reducer;   ///< parallel/reducer.h (internal)
class Timeline;  ///< timeline.h

/// Who all-reduces the gradients and broadcasts parameters and buffers. Auto: NCCL when the
/// parameters are on this rank's GPU and the build has the NCCL communicator, MPI otherwise.
enum class Backend {
  Auto,  ///< NCCL for a model on this rank's GPU (when built), MPI otherwise
  Mpi,   ///< MPI, for CPU tensors (GPU tensors through host memory)
  Nccl,  ///< NCCL, for a model on this rank's GPU
};

/// How DistributedDataParallel synchronises gradients. Must be equal on every rank (the
/// reducer checks the bucket layout that results).
struct DDPOptions {
  /// PyTorch's defaults. A cap smaller than every parameter (e.g. 1e-9) gives each parameter a
  /// bucket of its own (the benchmarks' per-parameter baseline).
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;  ///< small, so communication starts early in backward
  /// false: a parameter without a gradient on some rank is an error naming it and the rank.
  /// true: such gradients count as zero on that rank (every step pays a check either way).
  bool find_unused_parameters = false;
  Backend backend = Backend::Auto;  ///< who all-reduces
  /// true: prepare_forward() broadcasts rank 0's buffers (BatchNorm running statistics), as PyTorch
  /// DDP does before every forward, so every replica evaluates and checkpoints the same model.
  bool broadcast_buffers = true;
  /// true: after the first synchronised backward, buckets are regrouped (same caps) in the order
  /// rank 0 saw gradients arrive, as PyTorch's Reducer does. Reverse registration order only
  /// guesses that order; where it guesses wrong, a bucket waits for its latest gradient and its
  /// all-reduce overlaps less of backward.
  bool rebuild_buckets = true;
  Timeline* timeline = nullptr;  ///< records each bucket's all-reduce when set
  /// true: build the Reducer at one rank too, as PyTorch's DDP always does, so that a single
  /// process runs the whole bucket path (hooks, buckets, the backend's all-reduce on its stream
  /// or thread, rebuild_buckets, no_sync(), find_unused_parameters): how one GPU proves the NCCL
  /// gradient path. Gradients equal a plain step's bit for bit (a sum over one rank, divided by
  /// one) unless the comm hook casts them (fp16_compress_hook()); a parameter without a gradient is
  /// then an error unless find_unused_parameters, as with more ranks. false (default): at one rank
  /// there is nothing to average and no Reducer is built. No effect with more than one rank.
  bool reducer_at_one_rank = false;
  /// true: every parameter's grad() is a view into the reducer's flat bucket (PyTorch's
  /// gradient_as_bucket_view), so backward accumulates straight into the bucket and nothing is
  /// copied in before the all-reduce or out after it; the gradients take no memory of their own.
  /// Results are bit-identical to false. A grad() that exists at construction becomes a view
  /// then, the others at the first synchronised backward that produces them; the bucket rebuild
  /// moves them into the new buckets, values included. A grad() that was reset
  /// (optimizer.zero_grad() with set_to_none, LibTorch's default) or replaced by another tensor is
  /// copied into its bucket at the next synchronised backward and becomes the view again: correct,
  /// but the copy and the memory are back, so zero in place (optimizer.zero_grad(false), as the
  /// Trainer does with this option). No effect without a Reducer (one rank, reducer_at_one_rank
  /// false).
  bool gradient_as_bucket_view = false;
};

/// Parses "auto" / "mpi" / "nccl"; throws std::invalid_argument naming the value otherwise.
///@{
Backend parse_backend(const std::string& name);
///@}
/// The names the parsers accept, for messages and logs.
///@{
const char* backend_name(Backend backend);
///@}

/// Wraps any torch::nn::Module for data-parallel training: after loss.backward() every
/// parameter's grad() holds the average over all ranks (this file's comment says how).
class DistributedDataParallel {
 public:
  /// A module whose forward() the wrapper can call (forward(), operator() below): one forward
  /// method, not overloaded or templated (LibTorch's AnyModule's rule).
  template <typename ModuleType,
            typename = std::enable_if_t<torch::detail::has_forward<ModuleType>::value>>
  DistributedDataParallel(ProcessGroup& group, std::shared_ptr<ModuleType> module,
                          DDPOptions options = {})
      : DistributedDataParallel(group, std::shared_ptr<torch::nn::Module>(module), options,
                                torch::nn::AnyModule(module)) {}
  /// A TORCH_MODULE holder (torch::nn::Linear, MyNet).
  template <typename ModuleType>
  DistributedDataParallel(ProcessGroup& group, const torch::nn::ModuleHolder<ModuleType>& module,
                          DDPOptions options = {})
      : DistributedDataParallel(group, module.ptr(), options) {}
  /// torch::nn::Sequential: forward() runs it as Sequential's own forward does (its forward is
  /// a template, which AnyModule cannot hold), with the same ReturnType rule.
  DistributedDataParallel(ProcessGroup& group, const torch::nn::Sequential& module,
                          DDPOptions options = {})
      : DistributedDataParallel(group, module.ptr(), options) {}
  /// The same, from the SequentialImpl itself.
  DistributedDataParallel(ProcessGroup& group, std::shared_ptr<torch::nn::SequentialImpl> module,
                          DDPOptions options = {});
  /// A TorchScript model (torch::jit::load of a model scripted in Python): module() is a
  /// torch::nn::Module holding the script's parameters and buffers themselves (the same tensors,
  /// the same dotted names), so everything that takes a module (the Checkpointer, save_module,
  /// replica checks) takes module(). forward() is unavailable: call model.prepare_forward(),
  /// then script.forward({x}), before each training forward.
  DistributedDataParallel(ProcessGroup& group, const torch::jit::Module& script,
                          DDPOptions options = {});
  /// Any module; forward() is then unavailable (a module whose forward is overloaded or a
  /// template, or that has none: its type does not say what to call): run the module yourself
  /// and call prepare_forward() before each training forward. forward() then throws
  /// std::logic_error naming the module's type and this fix.
  DistributedDataParallel(ProcessGroup& group, std::shared_ptr<torch::nn::Module> module,
                          DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// The module it wraps.
  torch::nn::Module& module() const { return *module_; }
  /// As given, with the backend resolved (Mpi or Nccl, never Auto).
  const DDPOptions& options() const { return options_; }

  /// While the guard lives, backward accumulates gradients locally without communication; the
  /// first backward after it averages everything accumulated (PyTorch's no_sync()).
  class NoSync {
   public:
    /// Turns the synchronisation off until the guard goes.
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
  /// The NoSync guard: `{ auto guard = model.no_sync(); loss.backward(); }`.
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  /// Uneven inputs (PyTorch's model.join(divide_by_initial_world_size=False)): ranks whose data
  /// runs out at different steps all finish, none waits forever in a collective, and no rank's
  /// data is dropped.
  ///
  ///   auto join = model.join();          // every rank, before its loop
  ///   for (auto& batch : my_batches) {   // as many as this rank has
  ///     optimizer.zero_grad();
  ///     loss_fn(model(batch.data), batch.target).backward();
  ///     optimizer.step();
  ///   }
  ///   join.finish();                     // every rank, when it has no more
  ///
  /// While the guard lives, each training forward (forward() under grad mode, or
  /// prepare_forward()) first counts the ranks still training: one all-reduce of world size + 1
  /// integers. finish() then shadows the others: for each of their steps it takes part in the
  /// count, the buffer broadcast and the gradient reduction, contributing no gradient, until every
  /// rank has called it; it ends by broadcasting the parameters and buffers of the highest rank
  /// that trained last, so every rank leaves with the same model. In a step some ranks sit out:
  ///  - allreduce_hook(), fp16 and bf16 divide by the ranks still training
  ///    (GradBucket::training_ranks): the average of their gradients, as with every rank training;
  ///    a hook that divides by comm.size() (PowerSGD, PyTorch's hooks) averages over every rank,
  ///    the finished ones counting as zeros (PyTorch's default, divide_by_initial_world_size);
  ///  - buffers come from the highest rank still training, not rank 0 (PyTorch's rule).
  /// Contract: per step, one training forward and at most one synchronised backward of this
  /// model, and no_sync() on all training ranks or none (otherwise a std::runtime_error on every
  /// rank). Collectives the loop makes besides this model's (a StepBoundary, another model,
  /// SyncBatchNorm, ZeroRedundancyOptimizer, your own) are not shadowed: a finished rank waits in
  /// finish() and the job ends with the error that names a collective called by some ranks only.
  /// A guard destroyed without finish() (an exception) only detaches; it makes no collective.
  class Join {
   public:
    /// Attaches to `ddp` (one guard at a time; std::logic_error otherwise); no collective.
    explicit Join(DistributedDataParallel& ddp);
    ~Join();
    Join(const Join&) = delete;
    Join& operator=(const Join&) = delete;
    /// This rank has no more data: shadows the ranks still training until all have called it,
    /// then sets every rank's model to the last trainer's. Collective; once.
    void finish();
    /// The other ranks' steps finish() took part in, on this rank.
    int64_t shadowed_steps() const { return shadowed_; }

   private:
    DistributedDataParallel& ddp_;
    bool finished_ = false;
    int64_t shadowed_ = 0;
  };
  /// The Join guard: `auto join = model.join();` (see there).
  [[nodiscard]] Join join() { return Join(*this); }
  /// false: backward accumulates locally, without communication (what NoSync does).
  void set_sync_enabled(bool enabled);
  /// false inside no_sync().
  bool sync_enabled() const;

  /// Runs the module's forward on `args` after the pre-forward work, as PyTorch's DDP forward
  /// does; returns what the module's forward returns (ReturnType: torch::Tensor unless named,
  /// e.g. model.forward<std::tuple<torch::Tensor, torch::Tensor>>(x)). The arguments are passed
  /// as LibTorch's AnyModule passes them: their types must be those of the forward's parameters
  /// (an int literal for an int64_t parameter is an error naming both types).
  ///
  /// Pre-forward work: always re-attaches replaced gradient hooks (local, a pointer comparison
  /// per parameter). Only when grad mode is on (a training forward), with more than one rank and
  /// options().broadcast_buffers: broadcasts rank 0's buffers, a collective. Under
  /// torch::NoGradGuard (evaluation) nothing is collective, so ranks may run different numbers of
  /// evaluation forwards (uneven test shards).
  ///
  /// Only for a wrapper built from a module type with a forward() (the templated constructors);
  /// otherwise std::logic_error.
  template <typename ReturnType = torch::Tensor, typename... Args>
  ReturnType forward(Args&&... args) {
    before_forward();
    if (sequential_) return sequential_->forward<ReturnType>(std::forward<Args>(args)...);
    return forward_.forward<ReturnType>(std::forward<Args>(args)...);
  }
  /// forward().
  template <typename ReturnType = torch::Tensor, typename... Args>
  ReturnType operator()(Args&&... args) {
    return forward<ReturnType>(std::forward<Args>(args)...);
  }
  /// Whether forward() can run the module (built from a module type with a forward(), or a
  /// Sequential).
  bool has_forward() const { return !forward_.is_empty() || sequential_ != nullptr; }

  /// The pre-forward work of forward(), for code that runs the module itself (the Trainer, whose
  /// Forward function calls the model; a wrapper built from a plain torch::nn::Module pointer).
  /// Superseded by forward(): a program that calls the model through the wrapper needs nothing
  /// else. Collective, unconditionally (also under NoGradGuard). With more than one rank:
  ///  - with options().broadcast_buffers, overwrites every buffer with rank 0's (one broadcast
  ///    per buffer dtype), so BatchNorm statistics stay identical;
  ///  - re-attaches the gradient hooks of parameters whose storage was swapped since the last
  ///    step (torch::load(model, ...) does that; ddp::load_module copies instead), which would
  ///    otherwise silently stop the averaging.
  void prepare_forward();

  /// Wall time the training thread spent on gradient sync that backward did not hide, and the
  /// bytes of the gradient buckets handed to the comm hook, since construction (0 with one rank
  /// and no Reducer: nothing to synchronise). The bytes are counted before a hook compresses
  /// them: with fp16 or PowerSGD fewer cross the network.
  ///@{
  double sync_seconds() const;
  int64_t sync_bytes() const;
  ///@}

  /// Sets what reduces each bucket of gradients (comm_hook.h; PyTorch's register_comm_hook; its
  /// state is what the hook captures, e.g. powersgd_hook(state)). Replaces the default,
  /// allreduce_hook(). Call it before the first training backward, identically on every rank;
  /// later it is a std::logic_error. With one rank and no Reducer (DDPOptions::reducer_at_one_rank
  /// false) there is nothing to reduce and the hook never runs. A hook that steps an optimizer
  /// (hook_then_optimizer()) is refused (std::invalid_argument, naming the reason) where a step
  /// would need more than one bucket: with find_unused_parameters (a parameter no rank used keeps
  /// its gradient, known only after the last bucket), and when a parameter of the optimizer is not
  /// one of the module's (no bucket would ever step it).
  void register_comm_hook(CommHook hook);

  /// The optimizer that loss.backward() steps (the registered hook's steps_optimizer()), so that
  /// the caller must not step it again; null where backward steps none: a hook that only
  /// reduces, or one rank without a Reducer, where the hook never runs (step after backward).
  torch::optim::Optimizer* backward_steps_optimizer() const;

  /// The reducer's buckets (parameter indices in registration order); empty with one rank
  /// unless DDPOptions::reducer_at_one_rank.
  std::vector<std::vector<size_t>> bucket_layout() const;

  /// The comm hook that reduces the buckets, described ("allreduce", "fp16", "powersgd(...)",
  /// "custom"); "none" with one rank and no Reducer, where nothing is reduced.
  std::string comm_hook_description() const;

  /// What the wrapper keeps between steps that the next steps depend on: the comm hook's state
  /// (CommHookState: PowerSGD's error feedback and matrices) and the bucket order the first
  /// synchronised backward rebuilt (a hook's state is per bucket). This rank's: the hook's state
  /// differs between ranks. Training snapshots save every rank's (snapshot.h), so a run resumed
  /// from one continues exactly; the Checkpointer does this when given the wrapper.
  void save_state(torch::serialize::OutputArchive& archive) const;
  /// Restores what save_state() wrote, before the first training backward (std::logic_error
  /// after it). Collective (every rank checks the bucket layout). The hook's state is restored
  /// only into a hook of the same description, and only when `same_rank` (the archive is this
  /// rank's own: a resume on as many ranks); the bucket order always. Returns what was not
  /// restored and why, one line each ("" when everything was), for the caller to say.
  std::string load_state(torch::serialize::InputArchive& archive, bool same_rank = true);

 private:
  DistributedDataParallel(ProcessGroup& group, std::shared_ptr<torch::nn::Module> module,
                          DDPOptions options, torch::nn::AnyModule forward);
  /// forward()'s pre-forward work (see there); throws when there is no forward to run.
  void before_forward();
  void broadcast_buffers();
  /// Every parameter and buffer from rank `root` (construction: 0; a Join's end: the last trainer).
  void broadcast_model(int root);
  /// Under a Join: all-reduces who trains this step (`training`: this rank does); sets
  /// buffer_root_ and the ranks the hooks divide by. Returns how many train and whether they sync.
  struct JoinCount {
    int training = 0;
    bool sync = false;
  };
  JoinCount count_training(bool training);

  std::shared_ptr<torch::nn::Module> module_;
  torch::nn::AnyModule forward_;  ///< empty: built from a plain torch::nn::Module or a Sequential
  std::shared_ptr<torch::nn::SequentialImpl> sequential_;  ///< set: built from a Sequential
  DDPOptions options_;
  int world_size_;
  /// Checks and the reducer's small exchanges, on an MPI communicator of their own.
  std::unique_ptr<Communicator> control_comm_;
  /// The chosen backend's: the group's NCCL communicator, or owned_comm_ (MPI). It broadcasts
  /// parameters and buffers and all-reduces the gradient buckets, in one queue.
  Communicator* comm_ = nullptr;
  std::unique_ptr<Communicator> owned_comm_;
  std::unique_ptr<Reducer> reducer_;  ///< destroyed first: it uses the communicators
  Join* join_ = nullptr;              ///< the attached Join guard, if any
  int buffer_root_ = 0;   ///< whose buffers broadcast_buffers() sends: rank 0 unless under a Join
  int last_trainer_ = 0;  ///< under a Join: the highest rank that trained in the latest step
};

}  // namespace ddp

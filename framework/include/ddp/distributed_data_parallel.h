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
/// Calling the module directly (net->forward(x)) still averages the gradients (the hooks sit on
/// the parameters) but skips forward()'s pre-forward work: BatchNorm statistics drift apart and
/// hooks replaced by torch::load stay detached, which replica_check.h detects.
///
/// Construction (collective): refuses a LibTorch layer whose member weight or bias is not its
/// registered parameter (reassigned: `lm_head->weight = wte->weight`, which ties the member forward
/// uses, not the parameter that trains and is saved), verifies that every rank has the same
/// parameters and buffers (the first mismatch is reported on every rank), picks the backend
/// (DDPOptions::backend, the same on every rank), broadcasts parameters and buffers from rank 0,
/// and, with more than one rank (or DDPOptions::reducer_at_one_rank), sets up the Reducer that
/// all-reduces gradients in buckets while backward runs.
///
/// A parameter that requires grad and gets no gradient is an error naming it (and its likely
/// cause, a member reassigned after it was registered), unless DDPOptions::find_unused_parameters:
/// after every synchronised backward with a Reducer, after the first one at one rank without.
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
namespace detail {
class FirstBackwardCheck;  ///< parallel/unused_parameters.h (internal)
}  // namespace detail

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
  /// bucket of its own.
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;  ///< small, so communication starts early in backward
  /// false: a parameter without a gradient on some rank is an error naming it and the rank
  /// (at one rank without a Reducer, in the first synchronised backward only).
  /// true: such gradients count as zero on that rank (every step pays a check either way).
  bool find_unused_parameters = false;
  Backend backend = Backend::Auto;  ///< who all-reduces
  /// true: prepare_forward() broadcasts rank 0's buffers (BatchNorm running statistics), as PyTorch
  /// DDP does before every forward, so every replica evaluates and checkpoints the same model.
  bool broadcast_buffers = true;
  /// true: after the first synchronised backward, buckets are regrouped (same caps) in the order
  /// rank 0 saw gradients arrive, as PyTorch's Reducer does: reverse registration order only
  /// guesses it, and where it guesses wrong a bucket waits for its latest gradient.
  bool rebuild_buckets = true;
  Timeline* timeline = nullptr;  ///< records each bucket's all-reduce when set
  /// true: build the Reducer at one rank too, as PyTorch's DDP always does, so one process runs
  /// the whole bucket path (how one GPU proves the NCCL gradient path). Gradients equal a plain
  /// step's bit for bit unless the comm hook casts them; a parameter without a gradient is an
  /// error unless find_unused_parameters. No effect with more than one rank.
  bool reducer_at_one_rank = false;
  /// true: every parameter's grad() is a view into the reducer's flat bucket (PyTorch's
  /// gradient_as_bucket_view): nothing is copied in or out, and the gradients take no memory of
  /// their own; results are bit-identical to false. A grad() reset (zero_grad() with set_to_none,
  /// LibTorch's default) or replaced is copied in at the next synchronised backward and becomes
  /// the view again: correct, but the copy is back, so zero in place (zero_grad(false)). No
  /// effect without a Reducer.
  bool gradient_as_bucket_view = false;
};

/// Parses "auto" / "mpi" / "nccl"; throws std::invalid_argument naming the value otherwise.
Backend parse_backend(const std::string& name);
/// The names the parsers accept, for messages and logs.
const char* backend_name(Backend backend);

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
  /// Every wrapper alive in this process, oldest first: each is listed from the end of its
  /// construction to its destruction, so that what saves a module finds the wrappers of it and
  /// their comm hook state (snapshot.h). Thread-safe; a pointer is valid while its wrapper lives.
  static std::vector<DistributedDataParallel*> live_wrappers();
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
  /// The NoSync guard: `{ auto guard = model.no_sync(); loss_fn(model(x), y).backward(); }`.
  /// The guard at the backward decides, except under join() (below).
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
  /// While the guard lives, each training forward first counts the ranks still training (one
  /// all-reduce). finish() then shadows the others' steps (the count, the buffer broadcast and the
  /// gradient reduction, contributing no gradient) until every rank has called it, and ends with
  /// every rank holding the model of the highest rank that trained last. In a step some ranks sit
  /// out, allreduce_hook(), fp16 and bf16 average over the ranks still training
  /// (GradBucket::training_ranks); a hook that divides by comm.size() (PowerSGD) counts the
  /// finished ones as zeros; buffers come from the highest rank still training.
  /// Contract: per step, one training forward and at most one synchronised backward of this
  /// model, and no_sync() on all training ranks or none (else a std::runtime_error on every rank).
  /// The forward decides whether its backward synchronises (no_sync() as it is then, PyTorch's
  /// rule): a backward under a guard taken after the forward synchronises, with one warning.
  /// Other collectives of the loop (a StepBoundary, SyncBatchNorm, your own) are not shadowed:
  /// the job ends with the error naming a collective called by some ranks only. A guard destroyed
  /// without finish() (an exception) only detaches; it makes no collective.
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
    void detach();  // no collective: the wrapper back to training without the guard
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
  /// does, and returns its result (ReturnType: torch::Tensor unless named, e.g.
  /// model.forward<std::tuple<torch::Tensor, torch::Tensor>>(x)). The argument types must be the
  /// forward's parameter types (AnyModule's rule; a mismatch is an error naming both).
  ///
  /// Pre-forward work: re-attaches replaced gradient hooks (local); in grad mode, with more than
  /// one rank and options().broadcast_buffers, broadcasts rank 0's buffers (collective). Under
  /// torch::NoGradGuard nothing is collective, so ranks may evaluate unevenly.
  ///
  /// std::logic_error when there is no forward to run (has_forward()).
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

  /// forward()'s pre-forward work, for code that runs the module itself (the Trainer; a wrapper
  /// without forward()). Collective, also under NoGradGuard. With more than one rank: broadcasts
  /// rank 0's buffers (with options().broadcast_buffers) and re-attaches the gradient hooks of
  /// parameters whose storage was swapped (torch::load), which would silently stop the averaging.
  void prepare_forward();

  /// Since construction: wall time the training thread spent on gradient sync that backward did
  /// not hide, and bytes of buckets handed to the comm hook, before it compresses them (0 without
  /// a Reducer).
  ///@{
  double sync_seconds() const;
  int64_t sync_bytes() const;
  ///@}

  /// Sets what reduces each bucket of gradients (comm_hook.h; PyTorch's register_comm_hook),
  /// replacing allreduce_hook(). Before the first training backward, identically on every rank;
  /// later a std::logic_error. Without a Reducer the hook never runs. A hook that steps an
  /// optimizer (hook_then_optimizer()) is refused (std::invalid_argument naming why) with
  /// find_unused_parameters, or when a parameter of the optimizer is not the module's.
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

  /// Whether the comm hook keeps state between steps (CommHook::state(): PowerSGD's), which a
  /// run resumes exactly only from a snapshot that holds it; false with one rank and no Reducer,
  /// where the hook never runs.
  bool comm_hook_has_state() const;

  /// What the next steps depend on: the comm hook's state (CommHookState: PowerSGD's error
  /// feedback and matrices) and the rebuilt bucket order (a hook's state is per bucket). This
  /// rank's: the hook's state differs between ranks. A snapshot of the wrapped module (or of a
  /// module that holds it) saves every rank's (snapshot.h), found from the module: a wrapper is
  /// known from its construction to its destruction, so a resumed run continues exactly.
  void save_state(torch::serialize::OutputArchive& archive) const;
  /// Restores what save_state() wrote, before the first training backward (after it only where
  /// the buckets are in the saved order already, as after training on from that snapshot;
  /// std::logic_error otherwise). Collective (every rank checks the bucket layout). The hook's
  /// state is restored only into a hook of the same description, and only when `same_rank` (the
  /// archive is this rank's own: a resume on as many ranks); the bucket order always. Returns
  /// what was not restored and why, one line each ("" when everything was), for the caller to say.
  std::string load_state(torch::serialize::InputArchive& archive, bool same_rank = true);

 private:
  DistributedDataParallel(ProcessGroup& group, std::shared_ptr<torch::nn::Module> module,
                          DDPOptions options, torch::nn::AnyModule forward);
  /// forward()'s pre-forward work (see there); throws when there is no forward to run.
  void before_forward();
  void broadcast_buffers();
  /// Re-attaches the gradient hooks of parameters whose grad accumulator autograd replaced.
  void reattach_hooks();
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
  /// Without a Reducer (one rank), unless find_unused_parameters: the first backward's check that
  /// every parameter got a gradient, as the Reducer checks every backward's.
  std::unique_ptr<detail::FirstBackwardCheck> first_backward_check_;
  Join* join_ = nullptr;              ///< the attached Join guard, if any
  int buffer_root_ = 0;   ///< whose buffers broadcast_buffers() sends: rank 0 unless under a Join
  int last_trainer_ = 0;  ///< under a Join: the highest rank that trained in the latest step
};

}  // namespace ddp

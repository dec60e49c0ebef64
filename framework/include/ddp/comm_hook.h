#pragma once
/// \file
/// Communication hooks: what DistributedDataParallel does with a bucket of gradients once they are
/// all in (PyTorch's DDP register_comm_hook). The reducer hands the hook each bucket, strictly in
/// bucket order, while backward still runs; the hook starts the bucket's reduction (an async
/// all-reduce on the Communicator it is given) and returns a BucketFuture. At the end of backward
/// the reducer waits for the futures, in bucket order, on the training thread, and copies each
/// result into the parameters' grad(). Built-ins: allreduce_hook() (the default), fp16/bf16
/// compression, PowerSGD, noop_hook() (no communication: for ZeroRedundancyOptimizer), and one
/// composition, hook_then_optimizer() (the optimizer stepped bucket by bucket inside backward).
///
/// A hook must issue the same collectives in the same order on every rank (the Communicator's
/// contract): decide only from what every rank knows (the bucket's index, sizes, the step count),
/// never from the gradients' values. The buffer holds this rank's gradients, not divided by the
/// number of ranks: dividing is the hook's business, as in PyTorch.
///
///   model.register_comm_hook([](ddp::Communicator& comm, ddp::GradBucket& bucket) {
///     bucket.buffer.div_(comm.size());
///     return ddp::BucketFuture(comm.all_reduce_async(bucket.buffer), bucket.buffer);
///   });

#include <ddp/communicator.h>

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace ddp {

/// One bucket, as a hook sees it. Valid during the hook call; `buffer` (and the `gradients` views
/// of it) stay the bucket's own memory until the reducer has the result.
struct GradBucket {
  size_t index = 0;      ///< 0 .. buckets - 1, the launch order
  bool is_last = false;  ///< the last bucket of this backward pass (PyTorch's is_last())
  torch::Tensor buffer;  ///< flat gradients of `parameters`, in that order, this rank's sum
  std::vector<torch::Tensor> gradients;   ///< views of `buffer`, shaped like `parameters`
  std::vector<torch::Tensor> parameters;  ///< the parameters whose gradients are in the bucket
  /// How many ranks' gradients the sum holds: comm.size(), fewer while some ranks have run out
  /// of data under DistributedDataParallel::Join (they contribute zeros). The built-in
  /// allreduce, fp16 and bf16 hooks divide by it.
  int training_ranks = 1;
};

/// A bucket's reduction in flight. wait() returns the reduced flat tensor (the bucket's numel and
/// dtype; the buffer itself or another tensor, which the reducer then copies in). Continuations
/// added by then() run inside wait(), on the training thread at the end of backward, so they may
/// issue further collectives (every rank waits for the buckets in the same order).
class BucketFuture {
 public:
  /// Done when `work` is: wait() waits for it and returns `result`.
  BucketFuture(std::unique_ptr<Work> work, torch::Tensor result);
  /// Already done: wait() returns `result`.
  explicit BucketFuture(torch::Tensor result);
  /// A future of `next` applied to this one's result.
  BucketFuture then(std::function<torch::Tensor(torch::Tensor)> next) &&;
  /// Runs what is left and returns the result; once only.
  torch::Tensor wait();
  /// The host span of the first collective, when its backend has one (for timelines).
  std::optional<Work::Span> host_span() const;

 private:
  std::shared_ptr<Work> work_;
  torch::Tensor result_;
  std::vector<std::function<torch::Tensor(torch::Tensor)>> next_;
};

/// What a comm hook keeps from one step to the next (PowerSGD's error feedback, its P and Q
/// matrices, its step count and random generator). A hook that has some hands it to CommHook, so
/// that training snapshots (snapshot.h) save it and a run resumed from one continues exactly as
/// if it had never stopped. Each rank's state is its own: save() writes this rank's, load() reads
/// what this rank saved (a snapshot keeps every rank's). A hook whose state is not handed over
/// resumes with whatever it captured, as constructed: a different run, said nowhere.
class CommHookState {
 public:
  virtual ~CommHookState() = default;
  /// Writes everything the hook's next steps depend on.
  virtual void save(torch::serialize::OutputArchive& archive) const = 0;
  /// Reads what save() wrote (of a hook with the same description); throws on a foreign archive.
  virtual void load(torch::serialize::InputArchive& archive) = 0;
};

/// What DistributedDataParallel calls for each bucket (see the top of this file): a function,
/// with the state it keeps between steps, if any, and a description of what it does (saved in
/// snapshots, so that a resume with another hook or other hook options is named). A lambda or
/// function converts to a stateless CommHook described as "custom".
class CommHook {
 public:
  /// What is called for each bucket.
  using Function = std::function<BucketFuture(Communicator& comm, GradBucket& bucket)>;

  /// No hook (false): as std::function's empty state, which register_comm_hook refuses.
  CommHook() = default;
  /// No hook, as CommHook(): `nullptr` converts, as it did to the std::function CommHook was.
  CommHook(std::nullptr_t) {}  // NOLINT(google-explicit-constructor)
  /// `function` for every bucket; `state` (may be null: stateless) what it keeps between steps;
  /// `description` its name and options ("powersgd(matrix_approximation_rank=4, ...)").
  CommHook(Function function, std::shared_ptr<CommHookState> state, std::string description);
  /// A stateless hook described as "custom": register_comm_hook([](auto& comm, auto& bucket)
  /// {...}).
  template <typename F, typename = std::enable_if_t<
                            std::is_invocable_r_v<BucketFuture, F&, Communicator&, GradBucket&> &&
                            !std::is_same_v<std::decay_t<F>, CommHook>>>
  CommHook(F function) : CommHook(Function(std::move(function)), nullptr, "custom") {}  // NOLINT

  /// Starts the reduction of `bucket` (the hook's function).
  BucketFuture operator()(Communicator& comm, GradBucket& bucket) const {
    return function_(comm, bucket);
  }
  /// Whether there is a function to call.
  explicit operator bool() const { return static_cast<bool>(function_); }
  /// What the hook keeps between steps; null for a stateless hook.
  const std::shared_ptr<CommHookState>& state() const { return state_; }
  /// Its name and options, as given.
  const std::string& description() const { return description_; }
  /// The optimizer this hook steps inside backward (a hook_then_optimizer() composition), so that
  /// the caller must not step it again after backward; null for a hook that only reduces.
  torch::optim::Optimizer* steps_optimizer() const { return steps_optimizer_; }

 private:
  friend CommHook hook_then_optimizer(CommHook inner, torch::optim::Optimizer& optimizer);
  Function function_;
  std::shared_ptr<CommHookState> state_;
  std::string description_;
  torch::optim::Optimizer* steps_optimizer_ = nullptr;
};

/// Divides the buffer by the number of ranks training (GradBucket::training_ranks) and sums it
/// over them: the default, the gradients' own dtype on the wire (PyTorch's allreduce_hook).
CommHook allreduce_hook();
/// As allreduce_hook(), but the bucket travels as IEEE half (fp16) or bfloat16: divided by the
/// number of ranks in its own dtype, then cast (so large sums do not overflow fp16), summed, cast
/// back. PyTorch's fp16_compress_hook casts before dividing, so its results differ in the last bit.
///@{
CommHook fp16_compress_hook();
CommHook bf16_compress_hook();
///@}

/// No communication: the bucket comes back as it went (PyTorch's noop_hook), described as "noop".
/// For ZeroRedundancyOptimizer, whose step() reduce-scatters the gradients itself: they cross the
/// network once, and DDP still broadcasts rank 0's weights and buffers and checks the gradients.
CommHook noop_hook();

/// `inner`, then the optimizer step of each bucket's parameters, inside backward (PyTorch's
/// _hook_then_optimizer): as soon as a bucket's reduction is waited for, its averages go to
/// grad() and `optimizer` steps those parameters only, while later buckets are still in flight.
/// loss.backward() then returns with the model stepped: do not call optimizer.step() after it
/// (the Trainer asks steps_optimizer()). Bit-identical to stepping after backward provided
/// `optimizer` updates each parameter from its own gradient and state only (SGD, Adam, AdamW,
/// Adagrad, RMSprop, ddp::Adadelta); one that takes a norm over all parameters, LBFGS and
/// ZeroRedundancyOptimizer must not be composed. Its state, schedules and zero_grad() work as
/// usual. Nothing can run between reduction and step (gradient clipping, a GradScaler, dropping a
/// non-finite step). no_sync() backward passes do not step.
///
/// Its state and description are `inner`'s, so a snapshot written with or without it resumes with
/// the other. register_comm_hook refuses it where a step needs more than one bucket. The optimizer
/// must outlive the wrapper that holds the hook.
CommHook hook_then_optimizer(CommHook inner, torch::optim::Optimizer& optimizer);

/// PowerSGD gradient compression (Vogels et al. 2019), step for step as PyTorch's powerSGD_hook
/// (powersgd_hook.cpp): its hyper-parameters (PyTorch's PowerSGDState arguments, same defaults)
/// and state. One state per model; it must not be shared between models.
struct PowerSGDState {
  int64_t matrix_approximation_rank = 1;  ///< rank of P Q^T; 1 to 4 is usual
  /// synchronised steps all-reduced uncompressed first; > 1 with error feedback or warm start
  /// (the buckets are rebuilt after the first step)
  int64_t start_powerSGD_iter = 1000;
  double min_compression_rate = 2;       ///< compress a matrix only if it shrinks by more than this
  bool use_error_feedback = true;        ///< add each step's compression error to the next step
  bool warm_start = true;                ///< start the power iteration from the previous step's Q
  double orthogonalization_epsilon = 0;  ///< added to column norms (guards all-zero columns)
  uint32_t random_seed = 0;  ///< numpy RandomState seed of the Qs' random initialisation

  /// State (PyTorch's names): synchronised steps so far, and per bucket index the error and the
  /// P and Q memories; the numbers of elements before and after compression, so far.
  ///@{
  int64_t iter = 0;
  std::map<size_t, torch::Tensor> error_dict, p_memory_dict, q_memory_dict;
  int64_t total_numel_before_compression = 0, total_numel_after_compression = 0;
  std::mt19937 rng{0};  ///< reseeded from random_seed by powersgd_hook()
  ///@}
};

/// The PowerSGD hook over `state` (checked here: rank >= 1, min_compression_rate > 0,
/// start_powerSGD_iter > 1 with error feedback or warm start; std::invalid_argument naming the
/// PowerSGDState field otherwise). Seeds state->rng from state->random_seed. The hook's
/// CommHookState is `state`'s second half (iter, the dictionaries, the totals, rng): snapshots
/// save it; the hyper-parameters are in its description ("powersgd(matrix_approximation_rank=1,
/// start_powerSGD_iter=1000, ...)"), which a resume compares rather than restores.
CommHook powersgd_hook(std::shared_ptr<PowerSGDState> state);

}  // namespace ddp

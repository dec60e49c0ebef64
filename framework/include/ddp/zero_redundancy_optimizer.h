#pragma once
/// \file
/// ZeroRedundancyOptimizer: ZeRO stage 1 (Rajbhandari et al. 2020) over any torch::optim
/// optimizer, after PyTorch's ZeroRedundancyOptimizer. Each rank keeps the optimizer state of its
/// shard of the parameters only: about 1/size() of what the unsharded optimizer holds.
///
///   ddp::ZeroRedundancyOptimizer optimizer(net->parameters(), group.cpu(),
///       [](std::vector<torch::Tensor> shard) {
///         return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-3));
///       });
///   optimizer.zero_grad();
///   loss.backward();   // each rank's own gradients: `net` itself, not wrapped in DDP
///   optimizer.step();  // reduce-scatter (average) them, step the shard, all-gather the weights
///
/// Partition (deterministic, the same on every rank): the parameters, largest first, each go to
/// the rank with the fewest elements so far (ties: the earlier parameter, the lower rank); a
/// shard keeps the parameters' order (owners()). Whole parameters, as c10d's: a tensor's state is
/// never split, so one large tensor keeps its state on one rank.
///
/// step(), collective: Communicator::reduce_scatter averages the gradients (undefined ones count
/// as zeros), each rank getting its own parameters' into grad(); the shard's optimizer steps;
/// Communicator::all_gather_into sends every rank's new parameters to every rank (the traffic of
/// one ring all-reduce). Afterwards a grad() is the average where this rank owns the parameter and
/// its own gradient elsewhere: call zero_grad() before the next backward.
///
/// With DistributedDataParallel: register noop_hook() (comm_hook.h) on the wrapper, so the
/// gradients cross the network once, in step(); with DDP's all-reduce too they would cross twice.
///
/// State dict: the consolidated state is the unsharded optimizer's (the factory's type over every
/// parameter), so an unsharded optimizer, or one at any number of ranks, loads it. save() is
/// collective and only rank 0 writes: keep rank 0's archive (torch::save(optimizer, path) on every
/// rank is correct only where the paths differ). load() is not collective.
///
/// Contract: every rank constructs it (collective: rank 0's parameters are broadcast) with the
/// same parameters, in the same order, of one dtype on one device, and calls step() and save()
/// alike. The factory makes one parameter group, whose options (a scheduler's learning rate) are
/// copied to the shard's optimizer at every step. Not supported: several parameter groups,
/// closures (LBFGS), and hook_then_optimizer() (its step is collective over every parameter).

#include <ddp/communicator.h>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

/// ZeRO-1 over `comm` (the contract is at the top of this file).
class ZeroRedundancyOptimizer final : public torch::optim::Optimizer {
 public:
  /// Makes the optimizer of a set of parameters (a rank's shard, or all for the consolidated
  /// state), with one parameter group.
  using Factory =
      std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor> params)>;

  /// Collective: partitions `parameters`, makes this rank's shard optimizer with `factory`, and
  /// broadcasts rank 0's parameters. `comm` must outlive it.
  ZeroRedundancyOptimizer(std::vector<torch::Tensor> parameters, Communicator& comm,
                          Factory factory);
  ~ZeroRedundancyOptimizer() override;

  /// Collective (see the top of this file). Returns an undefined tensor; a closure throws.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Collective: gathers every shard's state to rank 0, which writes the consolidated state (the
  /// unsharded optimizer's format); the other ranks write nothing. Throws std::runtime_error,
  /// naming the optimizer, on every rank when the shard optimizer keeps state outside its
  /// torch::optim::Optimizer::state() (which consolidating would lose).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads a consolidated state (any world size's, or an unsharded optimizer's of the same type
  /// over the same parameters) and keeps this rank's shard of it. Not collective.
  void load(torch::serialize::InputArchive& archive) override;

  /// The rank that steps each parameter, in the order of the constructor's `parameters`.
  const std::vector<int>& owners() const;
  /// Elements of the parameters this rank steps (the shard whose state it keeps).
  int64_t shard_numel() const;
  /// The optimizer of this rank's shard (its state() holds only the shard's).
  torch::optim::Optimizer& shard_optimizer();

 private:
  struct Impl;
  explicit ZeroRedundancyOptimizer(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Impl> make_impl(std::vector<torch::Tensor> parameters, Communicator& comm,
                                         Factory factory);
  // The unsharded optimizer holding every rank's `shards` state; `error` says why it would
  // lose some (then the result must not be used).
  std::unique_ptr<torch::optim::Optimizer> consolidate(const Impl& z,
                                                       const std::vector<std::string>& shards,
                                                       std::string& error) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

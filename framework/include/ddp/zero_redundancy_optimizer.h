#pragma once
/// \file
/// ZeroRedundancyOptimizer: ZeRO stage 1 (Rajbhandari et al. 2020) over any torch::optim
/// optimizer, in the spirit of PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer. Each
/// rank keeps the optimizer state (Adam's two moments, SGD's momentum) of its shard of the
/// parameters only: about 1/size() of what the unsharded optimizer holds on every rank.
///
///   ddp::ZeroRedundancyOptimizer optimizer(net->parameters(), group.cpu(),
///       [](std::vector<torch::Tensor> shard) {
///         return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-3));
///       });
///   optimizer.zero_grad();
///   loss.backward();   // each rank's own gradients: `net` itself, not wrapped in DDP
///   optimizer.step();  // reduce-scatter (average) them, step the shard, all-gather the weights
///
/// Partition (deterministic, the same on every rank): the parameters, largest first (ties: the
/// earlier one), each go to the rank with the fewest elements so far (ties: the lower rank);
/// a rank's shard keeps the parameters' order. owners() tells which rank steps which. Whole
/// parameters, as c10d's: a tensor's state is never split, so a model whose largest tensor holds
/// more than 1/size() of the elements keeps that tensor's state on one rank (bench_zero's MLP:
/// its 784x1024 weight is 60% of the model, so rank 0 keeps 60% of Adam's state at 2 ranks).
///
/// step(), collective: (1) the gradients go into one flat buffer of size() equal chunks, chunk r
/// holding rank r's parameters' gradients (an undefined gradient counts as zeros; the chunks'
/// padding up to the largest shard is zeros), and Communicator::reduce_scatter averages it:
/// this rank gets the averaged gradients of its own parameters, written into their grad();
/// (2) the shard's optimizer steps; (3) Communicator::all_gather_into sends every rank's new
/// parameters to every rank. Each rank sends and receives about 2 (n - 1) / n of the gradients'
/// bytes, as a ring all-reduce does, so ZeRO-1 costs no more traffic than DDP's all-reduce.
/// After step() a parameter's grad() is the average where this rank owns it and this rank's
/// own gradient elsewhere: call zero_grad() before the next backward (as every loop does).
///
/// With DistributedDataParallel: register noop_hook() (comm_hook.h) on the wrapper, so that
/// backward leaves each rank its own gradients and they cross the network once, in step()'s
/// reduce-scatter; the wrapper still checks and broadcasts the parameters and buffers and checks
/// that every rank produced every gradient. With DDP's default all-reduce as well, the gradients
/// would cross the network twice (the results are the same up to rounding: the average of
/// averages).
///
/// State dict: the consolidated state is the unsharded optimizer's (the factory's type over
/// every parameter, in order), so an unsharded optimizer, or a ZeroRedundancyOptimizer at any
/// number of ranks, loads it. save() (torch::optim::Optimizer::save) is collective: every rank
/// calls it, every shard's state is gathered to rank 0, and rank 0 writes the consolidated state;
/// the other ranks write nothing. So write rank 0's archive only (the training kit's snapshots call
/// save() on every rank and write rank 0's); torch::save(optimizer, path) must run on every rank
/// and is only correct where the ranks' paths differ. load() reads a consolidated state on every
/// rank (not collective) and keeps this rank's shard of it.
///
/// Contract: every rank constructs it (collective: rank 0's parameters are broadcast) with the
/// same parameters, in the same order, of one dtype on one device, and calls step() and save()
/// alike. The factory makes one parameter group; its options (the
/// learning rate a scheduler sets on param_groups()[0]) are copied to the shard's optimizer at
/// every step. Not supported: several parameter groups, closures (LBFGS), and composing it with
/// hook_then_optimizer() (its step is collective over every parameter, not per bucket).

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
  /// unsharded optimizer's format); the other ranks write nothing. Throws std::runtime_error on
  /// every rank when the shard optimizer keeps state that its torch::optim::Optimizer::state()
  /// does not hold (consolidating moves the state by parameter through state(): what is
  /// elsewhere would be lost), naming the optimizer.
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

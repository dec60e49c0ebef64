// ddp::BatchNorm1d, 2d and 3d (sync_batch_norm.h), each against torch::nn's layer of the same
// dimension: unsynchronised bit for bit, synchronised at N ranks to one process on the global
// batch. Run at 1, 2 and 4 ranks (distributed_np1/2/4).
//
// Tolerances: 1e-12 in float64 and 1e-5 in float32, relative and absolute (torch::allclose).
// The synchronised path is other arithmetic than ATen's batch-norm kernel on the whole batch
// (per-rank Welford statistics combined as count-weighted sums in float64, the variance as
// E[x^2] - mean^2, the scale and shift formed in float64), so the results agree to rounding,
// not bit for bit. The weight and bias gradients are sums over the batch and are compared per
// value (divided by the values per channel), at the scale of their terms. Measured on these
// data (mean 3, standard deviation 2, 6 to 26 samples), largest |got - want| / (1 + |want|)
// over every check at 1, 2 and 4 ranks: 3e-15 in float64, 3e-7 in float32, so the tolerances
// leave two orders of magnitude and more, yet lie below what an error in the formulas costs
// (the smallest, a biased running variance, moves running_var by momentum * var / (count - 1),
// about 3e-4 relative at the largest count here).
// The input gradient's rounding grows when a channel holds very few values (with 2, its two
// terms nearly cancel): 2 values per channel measured 4e-11 in float64, so each rank holds
// several samples.
#include <ddp/distributed_data_parallel.h>
#include <ddp/sync_batch_norm.h>
#include "comm/mpi/mpi_communicator.h"
#include "runtime/runtime_internals.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

namespace test_batch_norm {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

std::shared_ptr<ddp::MpiCommunicator> new_mpi_communicator() {
  return std::make_shared<ddp::MpiCommunicator>(ddp::detail::RuntimeInternals::comm(rt()));
}

// Forwards to an MpiCommunicator of its own and counts the all-reduces.
class CountingCommunicator final : public ddp::Communicator {
 public:
  CountingCommunicator() : mpi_(ddp::detail::RuntimeInternals::comm(rt())) {}
  std::string backend() const override { return mpi_.backend(); }
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  std::unique_ptr<ddp::Work> all_reduce_async(const torch::Tensor& tensor,
                                              ddp::ReduceOp op) override {
    ++all_reduces;
    return mpi_.all_reduce_async(tensor, op);
  }
  void broadcast(const torch::Tensor& tensor, int root) override { mpi_.broadcast(tensor, root); }
  torch::Tensor all_gather(const torch::Tensor& tensor) override { return mpi_.all_gather(tensor); }
  void barrier() override { mpi_.barrier(); }

  int all_reduces = 0;

 private:
  ddp::MpiCommunicator mpi_;
};

torch::nn::BatchNormOptions options(int64_t channels, c10::optional<double> momentum = 0.1,
                                    bool affine = true, bool track_running_stats = true) {
  return torch::nn::BatchNormOptions(channels)
      .momentum(momentum)
      .affine(affine)
      .track_running_stats(track_running_stats);
}

// Gives both modules the same non-trivial weight and bias.
template <typename A, typename B>
void set_same_affine(A& a, B& b, int64_t channels, torch::Dtype dtype) {
  if (!a->options.affine()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor w = torch::rand({channels}, torch::kDouble) + 0.5;
  const torch::Tensor bias = torch::randn({channels}, torch::kDouble);
  a->weight.copy_(w.to(dtype));
  b->weight.copy_(w.to(dtype));
  a->bias.copy_(bias.to(dtype));
  b->bias.copy_(bias.to(dtype));
}

std::vector<std::string> keys(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  return dict.keys();
}

// "[2, 3, 4]", as the layer's errors print shapes.
std::string shape_string(const std::vector<int64_t>& shape) {
  return c10::str(c10::IntArrayRef(shape));
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, tolerance, tolerance))
      << what << ": max diff " << (got - want).abs().max().item<double>() << " on rank "
      << rt().rank();
}

// Expects `call` to throw std::invalid_argument whose message contains every one of `parts`.
template <typename Call>
void expect_invalid_argument(Call call, const std::vector<std::string>& parts,
                             const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": no exception on rank " << rt().rank();
  } catch (const std::invalid_argument& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << what << ": '" << part << "' not in: " << e.what();
    }
  }
}

// One layer under test: ddp's module, torch::nn's of the same dimension, and the input's
// dimensions after [batch, channels].
template <typename MineT, typename ReferenceT, int64_t... Spatial>
struct Layer {
  using Mine = MineT;
  using Reference = ReferenceT;
  static std::vector<int64_t> shape(int64_t batch, int64_t channels) {
    return {batch, channels, Spatial...};
  }
  // The same rank of input with one value per sample and channel.
  static std::vector<int64_t> single_values(int64_t batch, int64_t channels) {
    return {batch, channels, (Spatial * 0 + 1)...};
  }
};

using Layers = ::testing::Types<Layer<ddp::BatchNorm1d, torch::nn::BatchNorm1d>,     // [N, C]
                                Layer<ddp::BatchNorm1d, torch::nn::BatchNorm1d, 7>,  // [N, C, L]
                                Layer<ddp::BatchNorm2d, torch::nn::BatchNorm2d, 5, 3>,
                                Layer<ddp::BatchNorm3d, torch::nn::BatchNorm3d, 2, 3, 4>>;

struct LayerNames {
  template <typename T>
  static std::string GetName(int) {
    const std::string name = c10::str(typename T::Mine(1)).substr(5, 11);  // "BatchNorm2d"
    const std::vector<int64_t> shape = T::shape(0, 0);
    return name + (shape.size() == 2 ? "_NC" : shape.size() == 3 ? "_NCL" : "");
  }
};

template <typename T>
class SyncBatchNorm : public ::testing::Test {};
TYPED_TEST_SUITE(SyncBatchNorm, Layers, LayerNames);

// Unsynchronised is torch::nn::BatchNormXd, bit for bit: the same kernel on the same state.
TYPED_TEST(SyncBatchNorm, LocalModeIsTorchBatchNorm) {
  using Mine = typename TypeParam::Mine;
  using Reference = typename TypeParam::Reference;
  const int64_t c = 3;
  for (const auto& opts : {options(c), options(c, c10::nullopt), options(c, 0.3, /*affine=*/false),
                           options(c, 0.1, true, /*track_running_stats=*/false)}) {
    const std::string name = c10::str(Reference(opts));
    torch::manual_seed(5);
    Reference reference(opts);
    Mine mine(opts);
    EXPECT_EQ(keys(mine->named_parameters()), keys(reference->named_parameters())) << name;
    EXPECT_EQ(keys(mine->named_buffers()), keys(reference->named_buffers())) << name;
    set_same_affine(mine, reference, c, torch::kFloat);
    for (int step = 0; step < 3; ++step) {
      const torch::Tensor x = torch::randn(TypeParam::shape(4, c)) * 3 + 1;
      const torch::Tensor r = torch::randn(TypeParam::shape(4, c));
      torch::Tensor x_mine = x.clone().requires_grad_(), x_ref = x.clone().requires_grad_();
      const torch::Tensor out_mine = mine(x_mine), out_ref = reference(x_ref);
      (out_mine * r).sum().backward();
      (out_ref * r).sum().backward();
      EXPECT_TRUE(torch::equal(out_mine, out_ref)) << name << ", step " << step;
      EXPECT_TRUE(torch::equal(x_mine.grad(), x_ref.grad())) << name << ", step " << step;
      const auto p_mine = mine->parameters(), p_ref = reference->parameters();
      ASSERT_EQ(p_mine.size(), p_ref.size()) << name;
      for (size_t i = 0; i < p_mine.size(); ++i) {
        EXPECT_TRUE(torch::equal(p_mine[i].grad(), p_ref[i].grad())) << name << ", parameter " << i;
      }
      const auto b_mine = mine->buffers(), b_ref = reference->buffers();
      ASSERT_EQ(b_mine.size(), b_ref.size()) << name;
      for (size_t i = 0; i < b_mine.size(); ++i) {
        EXPECT_TRUE(torch::equal(b_mine[i], b_ref[i]))
            << name << ", buffer " << i << ", step " << step;
      }
    }
    mine->eval();
    reference->eval();
    const torch::Tensor x = torch::randn(TypeParam::shape(2, c));
    EXPECT_TRUE(torch::equal(mine(x), reference(x))) << name << ", eval";

    // A clone (what replicas and Module::clone users get) is the same layer with its own state.
    const auto copy = std::dynamic_pointer_cast<typename Mine::ContainedType>(mine->clone());
    ASSERT_TRUE(copy) << name;
    EXPECT_TRUE(torch::equal(copy->forward(x), reference(x))) << name << ", clone";
    if (opts.track_running_stats()) {
      EXPECT_NE(copy->running_mean.data_ptr(), mine->running_mean.data_ptr()) << name << ", clone";
    }
  }
  // The printout names ddp's layer and its mode.
  const std::string printed = c10::str(Mine(5));
  const std::string torch_printed = c10::str(Reference(5));
  EXPECT_EQ(printed.substr(0, 17), "ddp::" + torch_printed.substr(11, 12)) << printed;
  EXPECT_NE(printed.find("synchronised=false"), std::string::npos) << printed;
}

TYPED_TEST(SyncBatchNorm, StateLoadsIntoTorchBatchNormAndBack) {
  using Mine = typename TypeParam::Mine;
  using Reference = typename TypeParam::Reference;
  torch::manual_seed(6);
  const int64_t c = 4;
  Reference reference(c);
  set_same_affine(reference, reference, c, torch::kFloat);
  for (int step = 0; step < 2; ++step) reference(torch::randn(TypeParam::shape(3, c)) + step);

  std::stringstream from_torch;
  torch::save(reference, from_torch);
  Mine mine(c);
  torch::load(mine, from_torch);
  EXPECT_EQ(mine->num_batches_tracked.template item<int64_t>(), 2);
  for (const auto& item : reference->named_parameters()) {
    EXPECT_TRUE(torch::equal(mine->named_parameters()[item.key()], item.value())) << item.key();
  }
  for (const auto& item : reference->named_buffers()) {
    EXPECT_TRUE(torch::equal(mine->named_buffers()[item.key()], item.value())) << item.key();
  }

  mine(torch::randn(TypeParam::shape(3, c)));
  std::stringstream from_ddp;
  torch::save(mine, from_ddp);
  Reference back(c);
  torch::load(back, from_ddp);
  EXPECT_EQ(back->num_batches_tracked.template item<int64_t>(), 3);
  for (const auto& item : mine->named_buffers()) {
    EXPECT_TRUE(torch::equal(back->named_buffers()[item.key()], item.value())) << item.key();
  }
  for (const auto& item : mine->named_parameters()) {
    EXPECT_TRUE(torch::equal(back->named_parameters()[item.key()], item.value())) << item.key();
  }
}

struct SyncCase {
  const char* name;
  torch::Dtype dtype;
  double tolerance;  // see the top of this file
  torch::nn::BatchNormOptions options;
};

// Rank r holds samples [offset(r), offset(r) + batch(r)) of the global batch: the counts differ
// across ranks, and at 4 ranks rank 2's batch is empty.
int64_t batch(int r) { return r == 2 ? 0 : 6 + 2 * r; }
int64_t offset(int r) {
  int64_t o = 0;
  for (int q = 0; q < r; ++q) o += batch(q);
  return o;
}
torch::Tensor my_slice(const torch::Tensor& t) {
  const int r = rt().rank();
  return t.slice(0, offset(r), offset(r) + batch(r));
}

// N ranks on their slices of a batch compute what torch::nn::BatchNormXd computes on the whole
// batch: outputs, input gradients, weight and bias gradients summed over the ranks, running
// statistics; then eval mode, without communicating.
TYPED_TEST(SyncBatchNorm, SynchronisedEqualsOneProcessOnTheGlobalBatch) {
  using Mine = typename TypeParam::Mine;
  using Reference = typename TypeParam::Reference;
  const int64_t c = 4, total = offset(rt().world_size()), steps = 3;
  const std::vector<SyncCase> cases = {
      {"float64", torch::kDouble, 1e-12, options(c)},
      {"float64, cumulative average", torch::kDouble, 1e-12, options(c, c10::nullopt)},
      {"float64, no affine", torch::kDouble, 1e-12, options(c, 0.2, /*affine=*/false)},
      {"float64, no running statistics", torch::kDouble, 1e-12, options(c, 0.1, true, false)},
      {"float32", torch::kFloat, 1e-5, options(c)},
  };
  for (const SyncCase& sc : cases) {
    torch::manual_seed(7);
    Reference reference(sc.options);
    Mine mine(sc.options);
    reference->to(sc.dtype);
    mine->to(sc.dtype);
    set_same_affine(mine, reference, c, sc.dtype);
    auto comm = std::make_shared<CountingCommunicator>();
    mine->set_sync_communicator(comm);
    EXPECT_TRUE(mine->synchronised());
    std::vector<int64_t> steps_shape = TypeParam::shape(total, c);
    steps_shape.insert(steps_shape.begin(), steps);
    const torch::Tensor x = (torch::randn(steps_shape, torch::kDouble) * 2 + 3).to(sc.dtype);
    const torch::Tensor weights =
        torch::randn(TypeParam::shape(total, c), torch::kDouble).to(sc.dtype);
    for (int64_t s = 0; s < steps; ++s) {
      const std::string where = std::string(sc.name) + ", step " + std::to_string(s);
      for (const auto& p : mine->parameters()) p.mutable_grad().reset();
      for (const auto& p : reference->parameters()) p.mutable_grad().reset();
      torch::Tensor x_mine = my_slice(x[s]).clone().requires_grad_();
      torch::Tensor x_ref = x[s].clone().requires_grad_();
      const torch::Tensor out_mine = mine(x_mine), out_ref = reference(x_ref);
      (out_mine * my_slice(weights)).sum().backward();
      (out_ref * weights).sum().backward();
      EXPECT_EQ(comm->all_reduces, 2 * (s + 1))
          << where << ": one all-reduce forward, one backward";

      expect_close(out_mine, my_slice(out_ref), sc.tolerance, where + ": output");
      expect_close(x_mine.grad(), my_slice(x_ref.grad()), sc.tolerance, where + ": input gradient");
      if (sc.options.affine()) {
        // Divided by the values per channel: the gradients of a mean over the batch, the scale
        // of the terms summed (see the top of this file).
        const double values = static_cast<double>(x[s].numel() / c);
        for (const char* p : {"weight", "bias"}) {
          const torch::Tensor summed = mine->named_parameters()[p].grad().clone();
          pg().cpu().all_reduce(summed);
          expect_close(summed / values, reference->named_parameters()[p].grad() / values,
                       sc.tolerance, where + ": " + p + " gradient summed over ranks, per value");
        }
      }
      if (sc.options.track_running_stats()) {
        expect_close(mine->running_mean, reference->running_mean, sc.tolerance,
                     where + ": running_mean");
        expect_close(mine->running_var, reference->running_var, sc.tolerance,
                     where + ": running_var");
        EXPECT_EQ(mine->num_batches_tracked.template item<int64_t>(), s + 1) << where;
      } else {
        EXPECT_FALSE(mine->running_mean.defined()) << where;
      }
    }
    // Eval mode, without running statistics too (then each rank normalises its own batch).
    mine->eval();
    reference->eval();
    const torch::Tensor x_eval = torch::randn(TypeParam::shape(2, c), torch::kDouble).to(sc.dtype);
    expect_close(mine(x_eval), reference(x_eval), sc.tolerance, std::string(sc.name) + ": eval");
    EXPECT_EQ(comm->all_reduces, 2 * steps) << sc.name << ": eval communicated";
  }
}

// With an input that needs no gradient (the first layer), backward has nothing to all-reduce;
// the weight and bias gradients are still right.
TYPED_TEST(SyncBatchNorm, SynchronisedBackwardSkipsTheAllReduceWithoutAnInputGradient) {
  using Mine = typename TypeParam::Mine;
  using Reference = typename TypeParam::Reference;
  const int64_t c = 3, total = offset(rt().world_size());
  torch::manual_seed(8);
  Reference reference(c);
  Mine mine(c);
  reference->to(torch::kDouble);
  mine->to(torch::kDouble);
  set_same_affine(mine, reference, c, torch::kDouble);
  auto comm = std::make_shared<CountingCommunicator>();
  mine->set_sync_communicator(comm);
  const torch::Tensor x = torch::randn(TypeParam::shape(total, c), torch::kDouble);
  const torch::Tensor weights = torch::randn(TypeParam::shape(total, c), torch::kDouble);
  (mine(my_slice(x)) * my_slice(weights)).sum().backward();
  (reference(x) * weights).sum().backward();
  EXPECT_EQ(comm->all_reduces, 1);
  for (const char* p : {"weight", "bias"}) {
    const torch::Tensor summed = mine->named_parameters()[p].grad().clone();
    pg().cpu().all_reduce(summed);
    expect_close(summed, reference->named_parameters()[p].grad(), 1e-12,
                 std::string(p) + " gradient");
  }
}

// One value per channel over all ranks cannot be normalised: every rank throws (none is left
// waiting in a collective), including those with an empty batch.
TYPED_TEST(SyncBatchNorm, SynchronisedRejectsOneValuePerChannelOnEveryRank) {
  using Mine = typename TypeParam::Mine;
  Mine bn(2);
  bn->set_sync_communicator(new_mpi_communicator());
  const torch::Tensor x = torch::randn(TypeParam::single_values(rt().rank() == 0 ? 1 : 0, 2));
  expect_invalid_argument(
      [&] { bn(x); },
      {c10::str(Mine(2)).substr(0, 16), "more than 1 value per channel over all ranks"},
      "one value");
  EXPECT_EQ(bn->num_batches_tracked.template item<int64_t>(), 0);
}

// A wrong rank of input or channel count is an error naming the layer and the input's shape,
// in either mode (synchronised, before any collective: no rank is left waiting).
TYPED_TEST(SyncBatchNorm, BadInputNamesTheLayerAndTheShape) {
  using Mine = typename TypeParam::Mine;
  const std::string name = c10::str(Mine(1)).substr(0, 16);  // "ddp::BatchNorm2d"
  for (const bool synchronised : {false, true}) {
    Mine bn(4);
    if (synchronised) bn->set_sync_communicator(new_mpi_communicator());
    const std::string mode = synchronised ? "synchronised" : "local";
    // 6D is too many for every layer; too few: 2D for BatchNorm2d and 3d, 1D for BatchNorm1d.
    const std::vector<int64_t> too_many = {2, 4, 3, 3, 3, 3};
    const std::vector<int64_t> too_few =
        TypeParam::shape(0, 0).size() > 3 ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{4};
    for (const auto& shape : {too_many, too_few}) {
      expect_invalid_argument([&] { bn(torch::randn(shape)); },
                              {name, shape_string(shape), "D input"},
                              mode + ", input " + shape_string(shape));
    }
    const std::vector<int64_t> wrong_channels = TypeParam::shape(2, 3);
    expect_invalid_argument([&] { bn(torch::randn(wrong_channels)); },
                            {name, shape_string(wrong_channels), "expected 4 channels"},
                            mode + ", channels");
    EXPECT_EQ(bn->num_batches_tracked.template item<int64_t>(), 0) << mode;
  }
}

// The layer inside a model trained by DistributedDataParallel after convert_sync_batchnorm:
// N ranks with 3 samples each train to the weights and running statistics of one process
// with torch::nn's layer on the 3N samples (the loss is a per-rank mean, which DDP's gradient
// averaging turns into the global mean because the batches are equal).
template <typename Norm>
struct Net : torch::nn::Module {
  Net()
      : mix(register_module("mix", torch::nn::Linear(3, 4))),
        norm(register_module("norm", Norm(4))),
        head(register_module("head", torch::nn::Linear(4, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor mixed = mix(x.movedim(1, -1)).movedim(-1, 1);  // channels 3 -> 4
    return head(torch::tanh(norm(mixed)).movedim(1, -1));
  }
  torch::nn::Linear mix;
  Norm norm;
  torch::nn::Linear head;
};

TYPED_TEST(SyncBatchNorm, DistributedDataParallelTrainsLikeOneProcessOnTheGlobalBatch) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t per_rank = 3, steps = 3;
  torch::manual_seed(9);
  auto mine = std::make_shared<Net<typename TypeParam::Mine>>();
  torch::manual_seed(9);
  auto reference = std::make_shared<Net<typename TypeParam::Reference>>();
  mine->to(torch::kDouble);
  reference->to(torch::kDouble);
  ASSERT_EQ(ddp::convert_sync_batchnorm(*mine, pg().for_device(torch::kCPU)), 1);
  ddp::DistributedDataParallel model(pg(), mine);
  torch::optim::SGD opt_mine(mine->parameters(), 0.1), opt_ref(reference->parameters(), 0.1);
  for (int64_t s = 0; s < steps; ++s) {
    const torch::Tensor x = torch::randn(TypeParam::shape(per_rank * w, 3), torch::kDouble) * 2 + 1;
    const torch::Tensor target =
        torch::randn(x.sizes(), torch::kDouble).movedim(1, -1).narrow(-1, 0, 1);
    const auto mine_slice = [&](const torch::Tensor& t) {
      return t.slice(0, r * per_rank, (r + 1) * per_rank);
    };
    opt_mine.zero_grad();
    opt_ref.zero_grad();
    torch::mse_loss(model.forward(mine_slice(x)), mine_slice(target)).backward();
    torch::mse_loss(reference->forward(x), target).backward();
    opt_mine.step();
    opt_ref.step();
  }
  const auto p_ref = reference->named_parameters();
  for (const auto& item : mine->named_parameters()) {
    expect_close(item.value(), p_ref[item.key()], 1e-12, item.key());
  }
  const auto b_ref = reference->named_buffers();
  for (const auto& item : mine->named_buffers()) {
    expect_close(item.value().to(torch::kDouble), b_ref[item.key()].to(torch::kDouble), 1e-12,
                 item.key());
  }
}

struct Block : torch::nn::Module {
  Block()
      : conv(register_module("conv", torch::nn::Conv2d(3, 4, 1))),
        norm(register_module("norm", ddp::BatchNorm2d(4))),
        stack(register_module(
            "stack", torch::nn::ModuleList(
                         ddp::BatchNorm1d(4), torch::nn::ReLU(),
                         torch::nn::Sequential(torch::nn::Conv3d(4, 4, 1), ddp::BatchNorm3d(4))))) {
  }
  torch::nn::Conv2d conv;
  ddp::BatchNorm2d norm;
  torch::nn::ModuleList stack;
};

TEST(ConvertSyncBatchnorm, ReachesNestedLayersOfEveryDimension) {
  auto comm = new_mpi_communicator();
  Block block;  // on the stack: the root is not reached through shared_from_this()
  EXPECT_FALSE(block.norm->synchronised());
  EXPECT_EQ(ddp::convert_sync_batchnorm(block, comm), 3);
  EXPECT_TRUE(block.norm->synchronised());
  EXPECT_TRUE(block.stack[0]->as<ddp::BatchNorm1dImpl>()->synchronised());
  EXPECT_TRUE(block.stack[2]
                  ->as<torch::nn::SequentialImpl>()
                  ->ptr(1)
                  ->as<ddp::BatchNorm3dImpl>()
                  ->synchronised());

  ddp::BatchNorm3d alone(2);
  EXPECT_EQ(ddp::convert_sync_batchnorm(*alone, comm), 1);
  EXPECT_TRUE(alone->synchronised());
  EXPECT_THROW(ddp::convert_sync_batchnorm(*alone, nullptr), std::invalid_argument);

  // A layer registered twice is one layer.
  torch::nn::ModuleList twice(alone, alone);
  EXPECT_EQ(ddp::convert_sync_batchnorm(*twice, comm), 1);
}

TEST(ConvertSyncBatchnorm, NamesTorchBatchNormLayersAndTheirReplacements) {
  torch::nn::ModuleList net(ddp::BatchNorm2d(3), torch::nn::BatchNorm2d(3),
                            torch::nn::Sequential(torch::nn::Flatten(), torch::nn::BatchNorm1d(48),
                                                  torch::nn::BatchNorm3d(2)));
  expect_invalid_argument(
      [&] { ddp::convert_sync_batchnorm(*net, new_mpi_communicator()); },
      {"1 (torch::nn::BatchNorm2d -> ddp::BatchNorm2d)",
       "2.1 (torch::nn::BatchNorm1d -> ddp::BatchNorm1d)",
       "2.2 (torch::nn::BatchNorm3d -> ddp::BatchNorm3d)", "<ddp/sync_batch_norm.h>"},
      "torch::nn layers");
  EXPECT_FALSE(net[0]->as<ddp::BatchNorm2dImpl>()->synchronised()) << "converted before refusing";
}

}  // namespace test_batch_norm

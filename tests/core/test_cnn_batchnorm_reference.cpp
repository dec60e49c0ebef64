// A CNN with BatchNorm trained by DistributedDataParallel equals PyTorch DDP (gloo, CPU) bit for
// bit (tests/reference/cnn_batchnorm.py, run at this test's world size): after every one of 20
// SGD-with-momentum steps each rank's loss, parameters and BatchNorm buffers (running mean and
// variance, num_batches_tracked) are those of the same rank of PyTorch's run, with a difference
// of exactly 0. What it pins down together: the gradient average (divided by the world size,
// then summed), rank 0's buffers broadcast before every training forward, each rank's own batch
// statistics, and LibTorch's optimizer against Python's. The same model under
// DistributedDataParallel::Join with uneven inputs equals PyTorch's ddp.join() (the last test).
#include <ddp/distributed_data_parallel.h>
#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace test_cnn_batchnorm_reference {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

// cnn_batchnorm.py's constants.
constexpr int64_t kSteps = 20, kBatch = 4, kChannels = 4, kSide = 8, kClasses = 3;
constexpr double kLr = 0.1, kMomentum = 0.9;

// cnn_batchnorm.py's closed_form(): sin(k * 1.3 + phase) * scale in float64, as float32.
torch::Tensor closed_form(int64_t count, double phase, double scale) {
  const torch::Tensor k = torch::arange(count, torch::kDouble);
  return (torch::sin(k * 1.3 + phase) * scale).to(torch::kFloat);
}

struct Model {
  torch::nn::Sequential net;
  torch::nn::BatchNorm2d bn{nullptr};
};

// cnn_batchnorm.py's build_model().
Model build_model() {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, kChannels, 3).padding(1));
  torch::nn::BatchNorm2d bn(kChannels);
  torch::nn::Linear linear(kChannels * (kSide / 2) * (kSide / 2), kClasses);
  {
    torch::NoGradGuard no_grad;
    conv->weight.copy_(
        closed_form(conv->weight.numel(), 0.0, 1.0 / 3).reshape(conv->weight.sizes()));
    conv->bias.copy_(closed_form(kChannels, 0.5, 0.1));
    bn->weight.copy_(1 + closed_form(kChannels, 1.0, 0.2));
    bn->bias.copy_(closed_form(kChannels, 1.5, 0.1));
    linear->weight.copy_(
        closed_form(linear->weight.numel(), 2.0, 1.0 / 8).reshape(linear->weight.sizes()));
    linear->bias.copy_(closed_form(kClasses, 2.5, 0.1));
  }
  torch::nn::Sequential net(conv, bn, torch::nn::ReLU(), torch::nn::MaxPool2d(2),
                            torch::nn::Flatten(), linear);
  return Model{net, bn};
}

torch::Tensor flat(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().reshape(-1).to(torch::kFloat));
  return torch::cat(parts);
}

// "STEP KEY : values" lines of a rank's file, by "STEP KEY", as float32.
std::map<std::string, torch::Tensor> read_reference(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cnn_batchnorm.py wrote no " + path);
  std::map<std::string, torch::Tensor> out;
  for (std::string line; std::getline(file, line);) {
    std::istringstream in(line);
    std::string step, key, colon;
    in >> step >> key >> colon;
    if (colon != ":") throw std::runtime_error(path + ": unexpected line " + line.substr(0, 80));
    std::vector<double> values;
    for (double v; in >> v;) values.push_back(v);
    out[step + " " + key] = torch::tensor(values, torch::kDouble).to(torch::kFloat);
  }
  return out;
}

// PyTorch's reference runs one intra-op thread per rank: so do these tests, so that every kernel
// (the convolution, the batch statistics' sums) reduces in the same order.
struct OneThread {
  const int before = torch::get_num_threads();
  OneThread() { torch::set_num_threads(1); }
  ~OneThread() { torch::set_num_threads(before); }
};

// This rank's lines of tests/reference/<script>.py, run at this world size.
std::map<std::string, torch::Tensor> reference_of(const std::string& script) {
  return read_reference(ddp_test::run_gloo_reference(script).dir + "/rank" +
                        std::to_string(rt().rank()) + ".txt");
}

// Compares `got` with the reference's lines "<key> <name>", bit for bit, or with `exact` false
// within float rounding; counts the comparisons.
void expect_equal(const std::map<std::string, torch::Tensor>& want, const std::string& key,
                  const std::map<std::string, torch::Tensor>& got, int64_t& compared,
                  bool exact = true) {
  for (const auto& [name, value] : got) {
    const std::string what = "rank " + std::to_string(rt().rank()) + ", step " + key + ", " + name;
    const auto expected = want.find(key + " " + name);
    ASSERT_NE(expected, want.end()) << what << ": not in the reference";
    ASSERT_EQ(value.numel(), expected->second.numel()) << what;
    EXPECT_TRUE(exact ? torch::equal(value, expected->second)
                      : torch::allclose(value, expected->second, /*rtol=*/1e-5, /*atol=*/1e-6))
        << what << ": max difference " << (value - expected->second).abs().max().item<double>();
    ++compared;
  }
}

TEST(PyTorchDdpReference, CnnWithBatchNormIsBitIdenticalEveryStep) {
  const int w = rt().world_size(), r = rt().rank();
  OneThread one_thread;
  const std::map<std::string, torch::Tensor> want = reference_of("cnn_batchnorm");
  ASSERT_FALSE(want.empty());

  Model model = build_model();
  ddp::DDPOptions options;
  options.reducer_at_one_rank = true;  // as PyTorch's DDP, which builds its Reducer at one rank too
  ddp::DistributedDataParallel ddp_model(pg(), model.net.ptr(), options);
  torch::optim::SGD optimizer(model.net->parameters(),
                              torch::optim::SGDOptions(kLr).momentum(kMomentum));
  const int64_t n = kSteps * w * kBatch;
  const torch::Tensor x =
      closed_form(n * kSide * kSide, 0.25, 1.0).reshape({kSteps, w * kBatch, 1, kSide, kSide}) +
      closed_form(n, 0.75, 0.5).reshape({kSteps, w * kBatch, 1, 1, 1});
  const torch::Tensor y =
      (torch::arange(n, torch::kLong) * 7 % kClasses).reshape({kSteps, w * kBatch});
  int64_t compared = 0;
  for (int64_t s = 0; s < kSteps; ++s) {
    optimizer.zero_grad();
    ddp_model
        .prepare_forward();  // a Sequential's forward is a template: the wrapper cannot call it
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        model.net->forward(x[s].slice(0, r * kBatch, (r + 1) * kBatch)),
        y[s].slice(0, r * kBatch, (r + 1) * kBatch));
    loss.backward();
    optimizer.step();
    const std::map<std::string, torch::Tensor> got = {
        {"loss", loss.detach().reshape({1})},
        {"params", flat(model.net->parameters())},
        {"buffers",
         flat({model.bn->running_mean, model.bn->running_var, model.bn->num_batches_tracked})}};
    expect_equal(want, std::to_string(s), got, compared);
  }
  EXPECT_EQ(compared, 3 * kSteps);
  // The test compares something that moves: the weights and the statistics changed.
  EXPECT_FALSE(torch::equal(want.at("0 params"), want.at(std::to_string(kSteps - 1) + " params")));
  EXPECT_FALSE(
      torch::equal(want.at("0 buffers"), want.at(std::to_string(kSteps - 1) + " buffers")));
}

// Uneven inputs against PyTorch's ddp.join(divide_by_initial_world_size=False)
// (tests/reference/join.py): rank R trains 3 + 2 R steps of the same model and data inside a
// Join, so rank 0 runs out first and each later step has fewer ranks training, down to one.
// Every step each training rank's loss, parameters and buffers, and after finish() every rank's
// model, equal PyTorch's: the average over the ranks still training, the buffers of the highest
// of them, the final model of the last to train. Bit for bit at 2 ranks; with 3 or more summed,
// gloo's ring and Open MPI add the gradients in another order (the CNN above differs by 7e-9 at
// 4 ranks), so there the values agree within float rounding (a wrong divisor or buffer root
// would differ by far more).
TEST(PyTorchDdpReference, JoinWithUnevenInputsIsBitIdentical) {
  const int w = rt().world_size(), r = rt().rank();
  const bool exact = w <= 2;
  OneThread one_thread;
  const std::map<std::string, torch::Tensor> want = reference_of("join");
  ASSERT_FALSE(want.empty());

  Model model = build_model();
  ddp::DDPOptions options;
  options.reducer_at_one_rank = true;
  ddp::DistributedDataParallel ddp_model(pg(), model.net, options);
  torch::optim::SGD optimizer(model.net->parameters(),
                              torch::optim::SGDOptions(kLr).momentum(kMomentum));
  const int64_t n = kSteps * w * kBatch;
  const torch::Tensor x =
      closed_form(n * kSide * kSide, 0.25, 1.0).reshape({kSteps, w * kBatch, 1, kSide, kSide}) +
      closed_form(n, 0.75, 0.5).reshape({kSteps, w * kBatch, 1, 1, 1});
  const torch::Tensor y =
      (torch::arange(n, torch::kLong) * 7 % kClasses).reshape({kSteps, w * kBatch});
  const int64_t my_steps = 3 + 2 * r;
  int64_t compared = 0;
  auto state = [&] {
    return std::map<std::string, torch::Tensor>{
        {"params", flat(model.net->parameters())},
        {"buffers",
         flat({model.bn->running_mean, model.bn->running_var, model.bn->num_batches_tracked})}};
  };
  auto join = ddp_model.join();
  for (int64_t s = 0; s < my_steps; ++s) {
    optimizer.zero_grad();
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        ddp_model.forward(x[s].slice(0, r * kBatch, (r + 1) * kBatch)),
        y[s].slice(0, r * kBatch, (r + 1) * kBatch));
    loss.backward();
    optimizer.step();
    auto got = state();
    got["loss"] = loss.detach().reshape({1});
    expect_equal(want, std::to_string(s), got, compared, exact);
  }
  join.finish();
  expect_equal(want, "final", state(), compared, exact);
  EXPECT_EQ(compared, 3 * my_steps + 2);
  // The ranks that ran out first took part in every later step.
  EXPECT_EQ(join.shadowed_steps(), 3 + 2 * (w - 1) - my_steps);
}

}  // namespace test_cnn_batchnorm_reference

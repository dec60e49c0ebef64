// Where bit-identity with PyTorch stops (issue 60, found by the GPT port; the README says so):
// LibTorch's own torch::nn::Linear on a 3-D input, its AdamW and Adam differ from Python's in the
// last bits, while torch::linear (what Python's nn.Linear calls) and SGD are bit-identical. The
// reference is tests/reference/bit_limits.py, run with the .venv's torch; the per-step schedule's
// closed form is test_step_pieces_vs_pytorch.cpp's.
#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

// name -> the line's float32 values.
std::map<std::string, std::vector<float>> bit_limits_reference() {
  std::istringstream lines(ddp_test::run_command(std::string(DDP_PYTHON) + " " + DDP_TEST_DIR +
                                                 "/reference/bit_limits.py"));
  std::map<std::string, std::vector<float>> values;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string name, colon;
    in >> name >> colon;
    for (std::string word; in >> word;) values[name].push_back(static_cast<float>(std::stod(word)));
  }
  return values;
}

struct Compared {
  int64_t differing = 0;  // values not bit-identical
  double largest = 0;     // the largest difference, relative to max(1, |python's value|)
};

Compared compare_bits(const torch::Tensor& ours, const std::vector<float>& python) {
  const torch::Tensor flat = ours.detach().flatten().contiguous();
  EXPECT_EQ(flat.numel(), static_cast<int64_t>(python.size()));
  Compared c;
  const float* v = flat.data_ptr<float>();
  for (size_t i = 0; i < python.size() && i < static_cast<size_t>(flat.numel()); ++i) {
    if (v[i] == python[i]) continue;
    ++c.differing;
    c.largest = std::max(c.largest, std::abs(double(v[i]) - python[i]) /
                                        std::max(1.0, std::abs(double(python[i]))));
  }
  return c;
}

TEST(BitLimits, LinearOn3DInputAndAdamWDifferFromPyTorchInTheLastBitsOnly) {
  torch::set_num_threads(1);  // as the script
  auto python = bit_limits_reference();
  torch::manual_seed(0);
  const torch::Tensor w = torch::randn({64, 1024}), b = torch::randn({64});
  const torch::Tensor x = torch::randn({2, 16, 1024});
  const torch::Tensor p0 = torch::randn({256}), g = torch::randn({10, 256});
  std::vector<float> sums;
  for (const auto& t : {w, b, x, p0, g}) sums.push_back(t.sum().item<float>());
  ASSERT_EQ(sums, python["inputs"]) << "the two sides drew other inputs";

  // torch::nn::Linear's forward is torch::nn::functional::linear: matmul, then the bias added.
  const Compared layer = compare_bits(torch::nn::functional::linear(x, w, b), python["linear_3d"]);
  EXPECT_GT(layer.differing, 0) << "LibTorch's Linear on 3-D input now equals Python's: the "
                                   "README's sentence on bit-identity is out of date";
  EXPECT_LT(layer.largest, 1e-5) << layer.differing << " values differ";
  EXPECT_EQ(compare_bits(torch::linear(x, w, b), python["linear_3d"]).differing, 0);

  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::Tensor)>;
  const std::vector<std::tuple<std::string, Make, bool>> optimizers = {
      {"adamw",
       [](torch::Tensor p) {
         return std::make_unique<torch::optim::AdamW>(
             std::vector<torch::Tensor>{p}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
       },
       false},
      {"adam",
       [](torch::Tensor p) {
         return std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{p},
                                                     torch::optim::AdamOptions(1e-2));
       },
       false},
      {"sgd",
       [](torch::Tensor p) {
         return std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{p},
                                                    torch::optim::SGDOptions(1e-2).momentum(0.9));
       },
       true},
  };
  for (const auto& [name, make, identical] : optimizers) {
    torch::Tensor p = p0.clone().requires_grad_(true);
    auto optimizer = make(p);
    for (int64_t k = 0; k < 10; ++k) {
      p.mutable_grad() = g[k].clone();
      optimizer->step();
    }
    const Compared c = compare_bits(p, python[name]);
    if (identical) {
      EXPECT_EQ(c.differing, 0) << name;
    } else {
      EXPECT_GT(c.differing, 0) << name << " now equals Python's: update the README";
      EXPECT_LT(c.largest, 1e-6) << name << ": " << c.differing << " values differ";
    }
  }
}

}  // namespace

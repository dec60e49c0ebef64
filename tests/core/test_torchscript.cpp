// A TorchScript model (scripted in Python by tests/reference/script_model.py, loaded with
// torch::jit::load) trains data-parallel through DistributedDataParallel.
#include <ddp/distributed_data_parallel.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace test_torchscript {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

// The scripted model's file, written by rank 0 with the reference Python.
std::string scripted_model() {
  const std::string path =
      std::string(DDP_TEST_TMP) + "/scripted_model_np" + std::to_string(rt().world_size()) + ".pt";
  if (rt().rank() == 0) {
    ddp_test::run_command(std::string(DDP_PYTHON) + " " + DDP_TEST_DIR +
                          "/reference/script_model.py " + path);
  }
  pg().cpu().barrier();
  return path;
}

std::vector<torch::Tensor> parameters_of(const torch::jit::Module& script) {
  std::vector<torch::Tensor> out;
  for (const auto& p : script.parameters()) out.push_back(p);
  return out;
}

torch::Tensor flat(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().flatten());
  return torch::cat(parts);
}

// Each rank trains the script on its shard; a second copy of the script, in this one process,
// gets the same update from every shard's gradient divided by the number of ranks and summed in
// rank order: what the all-reduce sums. Bit-identical at 1 and 2 ranks (a sum of two is the same
// in any order); at more, the communicator's order of the sum may differ in the last bits.
TEST(TorchScript, TrainsDataParallelAsOneProcessOnTheGlobalBatch) {
  // The graph executor optimises a script after its first runs, and the reference runs each step
  // once per shard: unoptimised, both run the same kernels from the first step on.
  torch::jit::GraphOptimizerEnabledGuard same_kernels(false);
  const std::string path = scripted_model();
  torch::jit::Module script = torch::jit::load(path), reference = torch::jit::load(path);
  script.train();
  reference.train();
  ddp::DistributedDataParallel model(pg(), script);
  EXPECT_EQ(model.module().parameters().size(), 6u);  // fc1, norm, fc2: weight and bias each
  EXPECT_EQ(model.module().named_buffers().size(), 3u);
  EXPECT_TRUE(model.module().named_parameters().contains("norm.weight"));
  const std::vector<torch::Tensor> mine = parameters_of(script), ref = parameters_of(reference);
  torch::optim::SGD opt(mine, torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(ref, torch::optim::SGDOptions(0.1).momentum(0.9));

  const int w = rt().world_size(), r = rt().rank();
  const int64_t b = 4, steps = 6;
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({steps, w * b, 10});
  const torch::Tensor y = torch::randint(0, 3, {steps, w * b}, torch::kLong);
  auto loss = [](torch::jit::Module& m, const torch::Tensor& in, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(m.forward({in}).toTensor(), target);
  };
  for (int64_t s = 0; s < steps; ++s) {
    model.prepare_forward();
    std::vector<torch::Tensor> buffers;
    for (const auto& buffer : script.buffers()) buffers.push_back(buffer.to(torch::kDouble));
    EXPECT_TRUE(ddp_test::identical_on_all_ranks(flat(buffers)))
        << "buffers not broadcast, step " << s;
    opt.zero_grad();
    loss(script, x[s].slice(0, r * b, (r + 1) * b), y[s].slice(0, r * b, (r + 1) * b)).backward();
    opt.step();

    std::vector<torch::Tensor> sum;
    for (int shard = 0; shard < w; ++shard) {
      ref_opt.zero_grad();
      loss(reference, x[s].slice(0, shard * b, (shard + 1) * b),
           y[s].slice(0, shard * b, (shard + 1) * b))
          .backward();
      for (size_t i = 0; i < ref.size(); ++i) {
        const torch::Tensor part = ref[i].grad() / w;
        if (shard == 0)
          sum.push_back(part);
        else
          sum[i] = sum[i] + part;
      }
    }
    for (size_t i = 0; i < ref.size(); ++i) ref[i].mutable_grad() = sum[i];
    ref_opt.step();

    const torch::Tensor got = flat(mine), want = flat(ref);
    if (w <= 2) {
      EXPECT_TRUE(torch::equal(got, want))
          << "step " << s << ": max diff " << (got - want).abs().max().item<double>();
    } else {
      EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-6)) << "step " << s;
    }
    EXPECT_TRUE(ddp_test::identical_on_all_ranks(got)) << "replicas diverged at step " << s;
  }
  if (w > 1) {
    EXPECT_GT(model.sync_bytes(), 0) << "the gradients did not go through the Reducer";
  }
}

}  // namespace test_torchscript

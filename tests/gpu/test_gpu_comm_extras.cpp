// Issue 29's parts on CUDA tensors over NCCL, at the world size the binary runs with (one rank on
// one GPU: the Reducer is built with reducer_at_one_rank): every comm hook (fp16, bf16, PowerSGD)
// against the same training on the CPU over MPI, the optimizer stepped inside backward against
// the plain step on the GPU (bit for bit), and ZeroRedundancyOptimizer over the NCCL
// communicator (reduce_scatter, all_gather_into) against the unsharded optimizer.
#include <ddp/comm_hook.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/zero_redundancy_optimizer.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

class GpuCommExtras : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!pg().has_gpu()) GTEST_SKIP() << "no CUDA device on this rank";
  }
};

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters())
    parts.push_back(p.detach().flatten().to(torch::kDouble).cpu());
  return torch::cat(parts);
}

// `steps` steps of the tiny MLP on `device`, this rank's rows of each global batch, through a
// wrapper with `options`; `setup` may register a hook or the overlapped step (returns true when
// backward steps the optimizer).
using Setup = std::function<bool(ddp::DistributedDataParallel&, torch::optim::Optimizer&)>;
torch::Tensor train(torch::Device device, ddp::DDPOptions options, const Setup& setup,
                    int steps = 6) {
  ddp_test::TinyMlp net;
  net->to(device);
  options.reducer_at_one_rank = true;
  ddp::DistributedDataParallel model(pg(), net, options);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const bool stepped_by_backward = setup ? setup(model, optimizer) : false;
  const int64_t share = 8, rank = rt().rank();
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(300 + s);
    const torch::Tensor x =
        torch::randn({share * rt().world_size(), 6}).slice(0, rank * share, (rank + 1) * share);
    const torch::Tensor y =
        torch::randn({share * rt().world_size(), 3}).slice(0, rank * share, (rank + 1) * share);
    optimizer.zero_grad();
    torch::mse_loss(model(x.to(device)), y.to(device)).backward();
    if (!stepped_by_backward) optimizer.step();
  }
  return flat(*net);
}

TEST_F(GpuCommExtras, CommHooksOnCudaMatchTheCpu) {
  ddp::DDPOptions small;
  small.bucket_cap_mb = small.first_bucket_mb = 400.0 / (1 << 20);  // several buckets
  const std::vector<std::pair<std::string, std::function<ddp::CommHook()>>> hooks = {
      {"fp16", [] { return ddp::fp16_compress_hook(); }},
      {"bf16", [] { return ddp::bf16_compress_hook(); }},
      {"powersgd", [] {
         auto state = std::make_shared<ddp::PowerSGDState>();
         state->start_powerSGD_iter = 2;
         return ddp::powersgd_hook(state);
       }}};
  for (const auto& [name, make] : hooks) {
    SCOPED_TRACE(name);
    auto with_hook = [&](ddp::DistributedDataParallel& m, torch::optim::Optimizer&) {
      m.register_comm_hook(make());
      return false;
    };
    const torch::Tensor cpu = train(torch::kCPU, small, with_hook);
    const torch::Tensor gpu = train(rt().device(), small, with_hook);
    // The same casts on both; the GPU's matrix products and QR differ from the CPU's in the
    // last bits, so a tolerance, not equality.
    EXPECT_TRUE(torch::allclose(gpu, cpu, 1e-4, 1e-4))
        << "max diff " << (gpu - cpu).abs().max().item<double>();
    if (name == "powersgd") {  // its low-rank approximation changes the gradients even at one rank
      EXPECT_FALSE(torch::equal(cpu, train(torch::kCPU, small, nullptr)))
          << "PowerSGD never compressed";
    }
  }
}

TEST_F(GpuCommExtras, OverlappedStepOnCudaEqualsThePlainStep) {
  ddp::DDPOptions small;
  small.bucket_cap_mb = small.first_bucket_mb = 400.0 / (1 << 20);
  const torch::Tensor plain = train(rt().device(), small, nullptr);
  const torch::Tensor overlapped =
      train(rt().device(), small, [](ddp::DistributedDataParallel& m, torch::optim::Optimizer& o) {
        m.register_comm_hook(ddp::hook_then_optimizer(ddp::allreduce_hook(), o));
        return m.backward_steps_optimizer() == &o;
      });
  EXPECT_TRUE(torch::equal(overlapped, plain))
      << "max diff " << (overlapped - plain).abs().max().item<double>();
}

TEST_F(GpuCommExtras, ZeroOverNcclEqualsTheUnshardedOptimizer) {
  auto adam = [](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
  };
  auto run = [&](bool zero) {
    ddp_test::TinyMlp net;
    net->to(rt().device());
    std::unique_ptr<torch::optim::Optimizer> optimizer =
        zero ? std::make_unique<ddp::ZeroRedundancyOptimizer>(net->parameters(), pg().gpu(), adam)
             : adam(net->parameters());
    const int64_t share = 8, rank = rt().rank(), n = rt().world_size();
    for (int s = 0; s < 5; ++s) {
      torch::manual_seed(400 + s);
      const torch::Tensor x = torch::randn({share * n, 6}), y = torch::randn({share * n, 3});
      optimizer->zero_grad();
      // ZeRO averages the shards' gradients itself; the reference sees the whole batch.
      const int64_t first = zero ? rank * share : 0, last = zero ? (rank + 1) * share : share * n;
      torch::mse_loss(net->forward(x.slice(0, first, last).to(rt().device())),
                      y.slice(0, first, last).to(rt().device()))
          .backward();
      optimizer->step();
    }
    return flat(*net);
  };
  const torch::Tensor unsharded = run(false), sharded = run(true);
  EXPECT_TRUE(torch::allclose(sharded, unsharded, 1e-6, 1e-6))
      << "max diff " << (sharded - unsharded).abs().max().item<double>();
}

}  // namespace

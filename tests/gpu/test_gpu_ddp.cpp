// DistributedDataParallel and the Reducer on a GPU over NCCL: the backend choice, equivalence
// with one process on the global batch, and backward leaving the host free (the reducer orders
// the current stream after the bucket all-reduces instead of waiting), and SyncBatchNorm over
// NCCL. Run under mpirun (one rank per GPU); every test skips on a rank without a CUDA device.
#include <ddp/sync_batch_norm.h>
#include <ddp/distributed_data_parallel.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

struct Net : torch::nn::Module {
  Net()
      : in(register_module("in", torch::nn::Linear(10, 32))),
        mid(register_module("mid", torch::nn::Linear(32, 32))),
        out(register_module("out", torch::nn::Linear(32, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::relu(mid(torch::tanh(in(x)))));
  }
  torch::nn::Linear in, mid, out;
};

torch::Tensor flat_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten().to(torch::kDouble));
  return torch::cat(parts).cpu();
}

class GpuDdp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!pg().has_gpu()) GTEST_SKIP() << "no CUDA device on this rank";
  }
};

TEST_F(GpuDdp, AutoPicksNcclForAModelOnTheGpuAndMpiForOneOnTheCpu) {
  auto on_gpu = std::make_shared<Net>();
  on_gpu->to(rt().device());
  EXPECT_EQ(ddp::DistributedDataParallel(pg(), on_gpu).options().backend, ddp::Backend::Nccl);
  EXPECT_EQ(ddp::DistributedDataParallel(pg(), std::make_shared<Net>()).options().backend,
            ddp::Backend::Mpi);
}

TEST_F(GpuDdp, ModelSplitAcrossDevicesIsRejectedNamingTheTensor) {
  auto net = std::make_shared<Net>();
  net->in->to(rt().device());  // the rest stays on the CPU
  ddp::DDPOptions options;
  options.backend = ddp::Backend::Nccl;
  try {
    ddp::DistributedDataParallel model(pg(), net, options);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'mid.weight' is on cpu"), std::string::npos)
        << e.what();
  }
}

// N ranks with batch b train like one process with batch N*b, for every reducer mode.
TEST_F(GpuDdp, NcclReducerEquivalentToOneProcessOnTheGlobalBatch) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t b = 4, steps = 4;
  struct Config {
    const char* name;
    double bucket_mb;
    bool rebuild;
    ddp::CommHook (*hook)();
    double tolerance;
  };
  const std::vector<Config> configs = {
      {"default buckets", 25, true, ddp::allreduce_hook, 1e-5},
      {"one bucket per parameter", 1e-6, true, ddp::allreduce_hook, 1e-5},
      {"per-parameter (no rebuild)", 1e-9, false, ddp::allreduce_hook, 1e-5},
      {"fp16 on the wire", 25, true, ddp::fp16_compress_hook, 2e-3}};
  for (const Config& c : configs) {
    ddp::DDPOptions options;
    options.reducer_at_one_rank = true;  // one GPU still runs the NCCL reducer
    options.rebuild_buckets = c.rebuild;
    options.bucket_cap_mb = options.first_bucket_mb = c.bucket_mb;
    torch::manual_seed(3);
    auto distributed = std::make_shared<Net>();
    distributed->to(rt().device());
    torch::manual_seed(3);
    auto reference = std::make_shared<Net>();
    reference->to(rt().device());
    ddp::DistributedDataParallel model(pg(), distributed, options);
    model.register_comm_hook(c.hook());
    ASSERT_EQ(model.options().backend, ddp::Backend::Nccl) << c.name;
    ASSERT_FALSE(model.bucket_layout().empty()) << c.name;
    const auto sgd = torch::optim::SGDOptions(0.1).momentum(0.9);
    torch::optim::SGD opt(distributed->parameters(), sgd);
    torch::optim::SGD ref_opt(reference->parameters(), sgd);

    torch::manual_seed(11);
    const torch::Tensor x = torch::randn({steps, w * b, 10}).to(rt().device());
    const torch::Tensor y = torch::randint(0, 3, {steps, w * b}, torch::kLong).to(rt().device());
    for (int64_t s = 0; s < steps; ++s) {
      opt.zero_grad();
      const torch::Tensor mine = x[s].slice(0, r * b, (r + 1) * b);
      torch::nn::functional::cross_entropy(distributed->forward(mine),
                                           y[s].slice(0, r * b, (r + 1) * b))
          .backward();
      opt.step();

      ref_opt.zero_grad();
      torch::nn::functional::cross_entropy(reference->forward(x[s]), y[s]).backward();
      ref_opt.step();

      const torch::Tensor got = flat_parameters(*distributed), want = flat_parameters(*reference);
      EXPECT_TRUE(torch::allclose(got, want, c.tolerance, c.tolerance))
          << c.name << ", step " << s << ": max diff " << (got - want).abs().max().item<double>();
    }
    EXPECT_EQ(model.options().backend, ddp::Backend::Nccl) << c.name;
  }
}

// The NCCL Reducer against the CPU: the same model, data and steps through DDP on the CPU (MPI)
// and on the GPU (NCCL), with DDPOptions::reducer_at_one_rank so that one GPU runs the bucket
// path, end within float tolerance of each other; at one rank the GPU run also equals plain GPU
// steps bit for bit (a sum over one rank, divided by one).
TEST_F(GpuDdp, NcclReducerMatchesTheCpuResult) {
  const int64_t b = 4, steps = 4;
  auto train = [&](torch::Device device, bool wrap) {
    torch::manual_seed(13);
    auto net = std::make_shared<Net>();
    net->to(device);
    std::unique_ptr<ddp::DistributedDataParallel> model;
    if (wrap) {
      ddp::DDPOptions options;
      options.reducer_at_one_rank = true;
      model = std::make_unique<ddp::DistributedDataParallel>(pg(), net, options);
      EXPECT_EQ(model->options().backend,
                device.is_cuda() ? ddp::Backend::Nccl : ddp::Backend::Mpi);
      EXPECT_FALSE(model->bucket_layout().empty());
    }
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::manual_seed(14 + rt().rank());
    const torch::Tensor x = torch::randn({steps, b, 10}).to(device);
    const torch::Tensor y = torch::randint(0, 3, {steps, b}, torch::kLong).to(device);
    for (int64_t s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::nn::functional::cross_entropy(net->forward(x[s]), y[s]).backward();
      opt.step();
    }
    if (model) {
      EXPECT_GT(model->sync_bytes(), 0);
    }
    return flat_parameters(*net);
  };
  const torch::Tensor cpu = train(torch::kCPU, true), gpu = train(rt().device(), true);
  EXPECT_TRUE(torch::allclose(gpu, cpu, 1e-5, 1e-5))
      << "max diff " << (gpu - cpu).abs().max().item<double>();
  if (rt().world_size() == 1) {
    const torch::Tensor plain = train(rt().device(), false);
    EXPECT_TRUE(torch::equal(gpu, plain))
        << "max diff " << (gpu - plain).abs().max().item<double>();
  }
}

// backward() returns while the GPU is still busy: the reducer queued the all-reduces and the
// copies into grad() behind the computation instead of waiting for them on the host. The
// gradients read afterwards are nevertheless the averaged ones.
TEST_F(GpuDdp, BackwardDoesNotMakeTheHostWaitForTheGpu) {
  torch::manual_seed(5);
  auto net = std::make_shared<Net>();
  net->to(rt().device());
  ddp::DDPOptions options;
  options.reducer_at_one_rank = true;  // one GPU still runs the NCCL reducer
  ddp::DistributedDataParallel model(pg(), net, options);
  // Every rank feeds the same batch, so the average gradient is the local one.
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({8, 10}).to(rt().device());
  torch::manual_seed(5);
  auto reference = std::make_shared<Net>();
  reference->to(rt().device());
  reference->forward(x).pow(2).mean().backward();

  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(rt().device().index());
  at::cuda::sleep(1'000'000'000);  // about half a second of GPU time before the forward
  net->forward(x).pow(2).mean().backward();
  EXPECT_FALSE(current.query()) << "backward waited for the GPU";
  for (const auto& p : net->named_parameters()) {
    const torch::Tensor want = reference->named_parameters()[p.key()].grad();
    EXPECT_TRUE(torch::allclose(p.value().grad(), want, 1e-5, 1e-6)) << p.key();
  }
}

// SyncBatchNorm over NCCL (ProcessGroup::for_device on the rank's GPU): N ranks on their slices
// of a batch compute what torch::nn::BatchNorm2d computes on the whole batch, on the GPU.
TEST_F(GpuDdp, SyncBatchNormOverNcclEqualsOneProcessOnTheGlobalBatch) {
  const int w = rt().world_size(), r = rt().rank();
  const int64_t b = 3, c = 4;
  const torch::Device device = rt().device();
  torch::manual_seed(8);
  const torch::Tensor x = (torch::randn({w * b, c, 5, 5}) * 2 + 1).to(device);
  const torch::Tensor weights = torch::randn({w * b, c, 5, 5}).to(device);
  torch::nn::BatchNorm2d reference(c);
  ddp::BatchNorm2d mine(c);
  reference->to(device);
  mine->to(device);
  ASSERT_EQ(ddp::convert_sync_batchnorm(*mine, pg().for_device(device)), 1);

  torch::Tensor x_mine = x.slice(0, r * b, (r + 1) * b).clone().requires_grad_();
  torch::Tensor x_ref = x.clone().requires_grad_();
  const torch::Tensor out_mine = mine(x_mine), out_ref = reference(x_ref);
  (out_mine * weights.slice(0, r * b, (r + 1) * b)).sum().backward();
  (out_ref * weights).sum().backward();
  EXPECT_TRUE(torch::allclose(out_mine, out_ref.slice(0, r * b, (r + 1) * b), 1e-4, 1e-5));
  EXPECT_TRUE(
      torch::allclose(x_mine.grad(), x_ref.grad().slice(0, r * b, (r + 1) * b), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(mine->running_mean, reference->running_mean, 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(mine->running_var, reference->running_var, 1e-4, 1e-6));
}

}  // namespace

// ZeRO-1 against the unsharded optimizer (docs/records/performance.md): Adam on an MLP of
// 784-1024-512-10 (1.33 M parameters, 5.3 MB of fp32), a synthetic batch per rank, three ways per
// round, the rounds alternating them:
//   ddp+adam   DistributedDataParallel (all-reduce) and torch::optim::Adam on every rank
//   zero       the unwrapped module and ZeroRedundancyOptimizer (reduce-scatter, shard step,
//              all-gather)
//   ddp+zero   DDP with noop_hook (no all-reduce: its checks and broadcasts only) and
//              ZeroRedundancyOptimizer (reduce-scatter, shard step, all-gather)
// Prints, per way, the median step time (forward, backward, synchronisation and optimizer; the
// slowest rank's time per step) and the optimizer state bytes on each rank (Adam's moments).
//   mpirun -np 2 bench_zero [STEPS] [ROUNDS] [BATCH]
#include <ddp/ddp.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    torch::manual_seed(1);
    a = register_module("a", torch::nn::Linear(784, 1024));
    b = register_module("b", torch::nn::Linear(1024, 512));
    c = register_module("c", torch::nn::Linear(512, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return c(torch::relu(b(torch::relu(a(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(Mlp);

std::unique_ptr<torch::optim::Optimizer> adam(std::vector<torch::Tensor> params) {
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
}

int64_t adam_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = dynamic_cast<const torch::optim::AdamParamState&>(*state);
    bytes += static_cast<int64_t>(s.exp_avg().nbytes() + s.exp_avg_sq().nbytes());
  }
  return bytes;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  ddp::Runtime runtime(argc, argv);
  return ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroup group(runtime);
    const int steps = argc > 1 ? std::stoi(argv[1]) : 30;
    const int rounds = argc > 2 ? std::stoi(argv[2]) : 3;
    const int64_t batch = argc > 3 ? std::stoll(argv[3]) : 64;
    torch::manual_seed(10 + group.rank());
    const torch::Tensor x = torch::randn({batch, 784});
    const torch::Tensor y = torch::randint(0, 10, {batch}, torch::kLong);
    const std::vector<std::string> ways{"ddp+adam", "zero", "ddp+zero"};
    std::map<std::string, std::vector<double>> times;
    std::map<std::string, int64_t> state_bytes;

    for (int round = 0; round < rounds; ++round) {
      for (const std::string& way : ways) {
        Mlp net;
        std::unique_ptr<ddp::DistributedDataParallel> model;
        if (way != "zero") model = std::make_unique<ddp::DistributedDataParallel>(group, net.ptr());
        if (way == "ddp+zero") model->register_comm_hook(ddp::noop_hook());
        std::unique_ptr<torch::optim::Optimizer> optimizer;
        ddp::ZeroRedundancyOptimizer* zero = nullptr;
        if (way == "ddp+adam") {
          optimizer = adam(net->parameters());
        } else {
          auto z =
              std::make_unique<ddp::ZeroRedundancyOptimizer>(net->parameters(), group.cpu(), adam);
          zero = z.get();
          optimizer = std::move(z);
        }
        std::vector<double> ms;
        for (int s = -3; s < steps; ++s) {  // 3 to warm up
          group.cpu().barrier();
          const auto start = std::chrono::steady_clock::now();
          optimizer->zero_grad();
          const torch::Tensor out = model ? model->forward(x) : net->forward(x);
          torch::nll_loss(torch::log_softmax(out, 1), y).backward();
          optimizer->step();
          if (s >= 0) {
            ms.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
          }
        }
        torch::Tensor all = torch::tensor(ms, torch::kDouble);
        group.cpu().all_reduce(all, ddp::ReduceOp::Max);
        std::vector<double> slowest(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
        times[way].push_back(median(slowest));
        state_bytes[way] = adam_state_bytes(zero ? zero->shard_optimizer() : *optimizer);
      }
    }
    torch::Tensor bytes =
        torch::tensor({state_bytes["ddp+adam"], state_bytes["zero"]}, torch::kLong);
    const torch::Tensor per_rank = group.cpu().all_gather(bytes);
    if (runtime.is_main()) {
      std::printf(
          "bench_zero: %d ranks, MLP 784-1024-512-10, batch %lld per rank, %d steps x %d rounds\n",
          group.size(), static_cast<long long>(batch), steps, rounds);
      for (const std::string& way : ways) {
        std::printf("  %-9s step median per round:", way.c_str());
        for (double t : times[way]) std::printf(" %.2f", t);
        std::printf(" ms\n");
      }
      std::printf("  Adam state bytes per rank: unsharded %lld; ZeRO",
                  static_cast<long long>(per_rank[0][0].item<int64_t>()));
      for (int r = 0; r < group.size(); ++r)
        std::printf(" %lld", static_cast<long long>(per_rank[r][1].item<int64_t>()));
      std::printf("\n");
    }
  });
}

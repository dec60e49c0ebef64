// What the launch tests need to see after a short data-parallel run, whatever started it:
//  - the topology ddp found (node, local rank) is the one the launcher says it made;
//  - after a few training steps on data that differs per rank, every rank holds bit-identical
//    weights.
//
//   replica_check [--steps N] [--no-ddp]
//
// It trains the seed MNIST CNN (examples/mnist_cnn.h) on random batches seeded by rank, from
// weights initialised differently on each rank, so without DistributedDataParallel the replicas
// differ: --no-ddp does that, to show the check fails then. Rank 0 prints one line per rank and
// "replicas identical: 4 ranks on 2 nodes"; a failed check ends the job with the reason.
#include "mnist_cnn.h"

#include <ddp/train/train.h>
#include "runtime/runtime_internals.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// One hash (ddp::tensor_hash, XXH64) of every parameter, flattened and concatenated in
// registration order: equal hashes mean bit-identical replicas here.
std::string weights_hash(torch::nn::Module& module) {
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& p : module.parameters())
    flat.push_back(p.detach().to(torch::kCPU).flatten());
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx",
                static_cast<unsigned long long>(ddp::tensor_hash(torch::cat(flat))));
  return text;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// Every rank checks its own place against the launcher's variables (where it sets them).
std::string check_topology(const ddp::Runtime& rt) {
  const ddp::LaunchInfo& launch = ddp::detail::RuntimeInternals::launch(rt);
  const std::string where = "rank " + std::to_string(rt.rank()) + ": ";
  if (launch.world_size >= 0) {
    require(launch.world_size == rt.world_size(),
            where + "the launcher started " + std::to_string(launch.world_size) +
                " ranks, MPI sees " + std::to_string(rt.world_size()));
  }
  if (launch.local_rank >= 0) {
    require(launch.local_rank == rt.local_rank(),
            where + "the launcher's local rank is " + std::to_string(launch.local_rank) +
                ", ddp found " + std::to_string(rt.local_rank()));
  }
  if (launch.local_size >= 0) {
    require(launch.local_size == rt.local_size(),
            where + "the launcher put " + std::to_string(launch.local_size) +
                " ranks on this node, ddp found " + std::to_string(rt.local_size()));
  }
  if (launch.node_index >= 0) {
    require(launch.node_index == rt.node_rank(),
            where + "the launcher's node index is " + std::to_string(launch.node_index) +
                ", ddp's node rank " + std::to_string(rt.node_rank()));
  }
  return rt.summary() + (launch.slurm_node.empty() ? "" : " slurm-node " + launch.slurm_node);
}

}  // namespace

int main(int argc, char** argv) {
  ddp::RuntimeOptions options;
  options.use_cuda = false;  // the test machines have no GPU; fake Slurm GPUs are /dev/null
  ddp::Runtime runtime(argc, argv, options);
  return ddp::run_or_abort(runtime, [&] {
    int steps = 3;
    bool use_ddp = true;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--steps" && i + 1 < argc) {
        steps = std::atoi(argv[++i]);
      } else if (arg == "--no-ddp") {
        use_ddp = false;
      } else {
        throw std::runtime_error("unknown argument '" + arg +
                                 "' (replica_check [--steps N] [--no-ddp])");
      }
    }

    ddp::ProcessGroup group(runtime);
    const std::string place = check_topology(runtime);
    const auto places = ddp::all_gather_strings(group.cpu(), place);
    if (runtime.is_main()) {
      for (const auto& line : places) std::cout << line << "\n";
    }

    torch::manual_seed(static_cast<uint64_t>(runtime.rank()));  // different initial weights
    auto net = std::make_shared<MnistCnn>();
    std::unique_ptr<ddp::DistributedDataParallel> model;
    if (use_ddp) model = std::make_unique<ddp::DistributedDataParallel>(group, net);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    torch::manual_seed(static_cast<uint64_t>(1000 + runtime.rank()));  // different data
    for (int step = 0; step < steps; ++step) {
      const torch::Tensor inputs = torch::randn({16, 1, 28, 28});
      const torch::Tensor targets = torch::randint(0, 10, {16}, torch::kLong);
      optimizer.zero_grad();
      torch::nll_loss(net->forward(inputs), targets).backward();
      optimizer.step();
    }

    const auto hashes = ddp::all_gather_strings(group.cpu(), weights_hash(*net));
    for (size_t r = 1; r < hashes.size(); ++r) {
      require(hashes[r] == hashes[0], "replicas differ after " + std::to_string(steps) +
                                          " steps: rank 0 has weights " + hashes[0] + ", rank " +
                                          std::to_string(r) + " has " + hashes[r]);
    }
    if (runtime.is_main()) {
      std::cout << "trained " << steps << " steps; replicas identical: " << runtime.world_size()
                << (runtime.world_size() == 1 ? " rank" : " ranks") << " on " << runtime.num_nodes()
                << (runtime.num_nodes() == 1 ? " node" : " nodes") << " (weights " << hashes[0]
                << ")" << std::endl;
    }
  });
}

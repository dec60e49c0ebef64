// GPU placement (select_device and friends in runtime.h, gpus_to_pair and gpu_rank_mismatch in
// launcher.h) for every way a node's GPUs reach its ranks, and the backend choice and NCCL
// timeout that follow from it. Fake environments and device counts: no GPU needed.
#include "runtime/launcher.h"
#include "parallel/reducer.h"
#include "parallel/resolve_backend.h"
#include <ddp/runtime.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/types.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace {

using ddp_test::contains;

using ddp::Environment;

const torch::Device kCpu(torch::kCPU);
torch::Device cuda(int index) {
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// One node as its ranks see it: the launcher's environment (the same for every rank here), how
// many CUDA devices each rank sees, and the UUID of the GPU each sees when it sees exactly one.
struct Node {
  Environment env;
  int visible = 0;
  int ranks = 1;
  std::vector<std::string> single_gpu_ids;  // empty: every rank sees all the node's GPUs
};

struct Placed {
  std::vector<torch::Device> devices;  // per local rank
  std::string warning;                 // rank 0's, for the node
};

// What the Runtime does with a node: place every local rank, then rank 0's pairing warning.
Placed place(const Node& node, bool use_cuda = true) {
  const std::vector<std::string> ids =
      node.single_gpu_ids.empty() ? std::vector<std::string>(node.ranks, "") : node.single_gpu_ids;
  const bool own = ddp::each_rank_sees_its_own_gpu(ids);
  const int visible = use_cuda ? node.visible : 0;
  Placed placed;
  for (int r = 0; r < node.ranks; ++r) {
    placed.devices.push_back(ddp::select_device(use_cuda, visible, r, node.ranks, own));
  }
  bool on_cuda = false;
  for (const auto& d : placed.devices) on_cuda = on_cuda || d.is_cuda();
  placed.warning = ddp::gpu_rank_mismatch(ddp::gpus_to_pair(node.env, visible, node.ranks, own),
                                          node.ranks, "n1", on_cuda);
  return placed;
}

std::string placement_error(const Node& node) {
  try {
    place(node);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Placement, EveryTaskSeesAllTheNodesGpus) {
  // srun --ntasks-per-node=4 --gpus-per-node=4, or mpirun -np 4 on a 4-GPU machine.
  const Node node{{{"SLURM_GPUS_ON_NODE", "4"}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}}, 4, 4, {}};
  const Placed placed = place(node);
  EXPECT_EQ(placed.devices, (std::vector<torch::Device>{cuda(0), cuda(1), cuda(2), cuda(3)}));
  EXPECT_EQ(placed.warning, "");
  // No launcher variables at all (a workstation): what CUDA shows is what counts.
  EXPECT_EQ(place({{}, 2, 2, {}}).devices, (std::vector<torch::Device>{cuda(0), cuda(1)}));
}

TEST(Placement, EveryTaskSeesOneGpuOfItsOwnRenumberedToZero) {
  // srun --ntasks-per-node=2 --gpus-per-task=1: Slurm's cgroup shows each task one GPU as 0.
  const Node slurm{
      {{"SLURM_GPUS_ON_NODE", "2"}, {"CUDA_VISIBLE_DEVICES", "0"}}, 1, 2, {"uuid-a", "uuid-b"}};
  const Placed placed = place(slurm);
  EXPECT_EQ(placed.devices, (std::vector<torch::Device>{cuda(0), cuda(0)}));
  EXPECT_EQ(placed.warning, "");
  // A wrapper exporting CUDA_VISIBLE_DEVICES=$LOCAL_RANK: each rank's variable lists one GPU,
  // which alone would look like two ranks sharing one.
  const Node wrapper{{{"CUDA_VISIBLE_DEVICES", "1"}}, 1, 2, {"uuid-a", "uuid-b"}};
  EXPECT_EQ(place(wrapper).devices, (std::vector<torch::Device>{cuda(0), cuda(0)}));
  EXPECT_EQ(place(wrapper).warning, "");
}

TEST(Placement, OneRankOnOneGpu) {
  const Placed placed = place({{{"CUDA_VISIBLE_DEVICES", "3"}}, 1, 1, {"uuid-a"}});
  EXPECT_EQ(placed.devices, std::vector<torch::Device>{cuda(0)});
  EXPECT_EQ(placed.warning, "");
}

TEST(Placement, MoreRanksThanGpusIsAnErrorNamingTheCountsAndTheFixes) {
  // mpirun -np 4 on a 2-GPU machine.
  const std::string error = placement_error({{}, 2, 4, {}});
  EXPECT_TRUE(contains(error, "4 ranks on this node but only 2 visible CUDA device(s)")) << error;
  EXPECT_TRUE(contains(error, "NCCL cannot run two ranks on one GPU")) << error;
  EXPECT_TRUE(contains(error, "srun --ntasks-per-node=2")) << error;
  EXPECT_TRUE(contains(error, "mpirun --npernode 2")) << error;
  EXPECT_TRUE(contains(error, "srun --gpus-per-task=1")) << error;
  EXPECT_TRUE(contains(error, "RuntimeOptions::use_cuda")) << error;
}

TEST(Placement, RanksSharingTheirOneVisibleGpuIsAnError) {
  // CUDA_VISIBLE_DEVICES=0 exported to both ranks: each sees one GPU, the same one.
  const std::string error = placement_error({{{"CUDA_VISIBLE_DEVICES", "0"}}, 1, 2, {"u", "u"}});
  EXPECT_TRUE(contains(error, "2 ranks on this node but only 1 visible CUDA device(s)")) << error;
  // One rank sees a GPU, the other none: not a GPU each either.
  EXPECT_NE(placement_error({{}, 1, 2, {"u", ""}}), "");
}

TEST(Placement, FewerRanksThanGpusUsesOneGpuPerRankAndSaysHowToUseAll) {
  // srun -N 2 --gpus-per-node=2 without --ntasks-per-node: one task per node sees both GPUs and
  // uses the first, as it would with one GPU; rank 0's notice says so, with the fix.
  const Node node{{{"SLURM_GPUS_ON_NODE", "2"}, {"CUDA_VISIBLE_DEVICES", "0,1"}}, 2, 1, {}};
  const Placed placed = place(node);
  EXPECT_EQ(placed.devices, std::vector<torch::Device>{cuda(0)});
  EXPECT_TRUE(contains(placed.warning, "node n1 has 2 GPUs but 1 rank")) << placed.warning;
  EXPECT_TRUE(contains(placed.warning, "each rank uses one GPU, so 1 GPU sits idle"))
      << placed.warning;
  EXPECT_TRUE(contains(placed.warning, "To use all 2, start one task per GPU")) << placed.warning;
  EXPECT_TRUE(contains(placed.warning, "srun --ntasks-per-node=2")) << placed.warning;
  EXPECT_TRUE(contains(placed.warning, "mpirun -np")) << placed.warning;
  EXPECT_FALSE(contains(placed.warning, "train on the CPU")) << placed.warning;
  // A workstation with 4 GPUs and 2 ranks, no launcher variables: CUDA's count still says so,
  // and each rank uses the GPU of its local rank.
  const Placed workstation = place({{}, 4, 2, {}});
  EXPECT_EQ(workstation.devices, (std::vector<torch::Device>{cuda(0), cuda(1)}));
  EXPECT_TRUE(contains(workstation.warning, "so 2 GPUs sit idle")) << workstation.warning;
  EXPECT_TRUE(contains(workstation.warning, "srun --ntasks-per-node=4")) << workstation.warning;
}

TEST(Placement, CpuWhenCudaIsOffOrShowsNothing) {
  const Node gpus{{{"SLURM_GPUS_ON_NODE", "2"}}, 2, 2, {}};
  const Placed off = place(gpus, /*use_cuda=*/false);  // --no-cuda
  EXPECT_EQ(off.devices, (std::vector<torch::Device>{kCpu, kCpu}));
  EXPECT_EQ(off.warning, "");  // 2 GPUs from the launcher, 2 ranks: they pair up
  // A CPU LibTorch on a GPU node: CUDA shows none, the launcher says 4.
  const Placed cpu_build = place({{{"SLURM_GPUS_ON_NODE", "4"}}, 0, 2, {}});
  EXPECT_EQ(cpu_build.devices, (std::vector<torch::Device>{kCpu, kCpu}));
  EXPECT_TRUE(contains(cpu_build.warning, "the ranks train on the CPU")) << cpu_build.warning;
  // No GPU anywhere: no warning. --no-cuda wins even over a GPU of one's own.
  EXPECT_EQ(place({{}, 0, 3, {}}).warning, "");
  EXPECT_EQ(ddp::select_device(false, 1, 0, 2, /*own_gpu=*/true), kCpu);
}

TEST(Placement, EachRankSeesItsOwnGpu) {
  EXPECT_TRUE(ddp::each_rank_sees_its_own_gpu({"a"}));
  EXPECT_TRUE(ddp::each_rank_sees_its_own_gpu({"b", "a", "c"}));
  EXPECT_FALSE(ddp::each_rank_sees_its_own_gpu({"a", "b", "a"}));
  EXPECT_FALSE(ddp::each_rank_sees_its_own_gpu({"a", ""}));
  EXPECT_FALSE(ddp::each_rank_sees_its_own_gpu({""}));
  EXPECT_FALSE(ddp::each_rank_sees_its_own_gpu({}));
}

TEST(GpusToPair, OwnGpusThenCudasCountThenTheLauncher) {
  const Environment slurm{{"SLURM_GPUS_ON_NODE", "8"}};
  EXPECT_EQ(ddp::gpus_to_pair(slurm, 1, 4, /*own_gpu=*/true), 4);
  EXPECT_EQ(ddp::gpus_to_pair(slurm, 2, 4, false), 2);
  EXPECT_EQ(ddp::gpus_to_pair(slurm, 0, 4, false), 8);
  EXPECT_EQ(ddp::gpus_to_pair({}, 0, 4, false), -1);
}

TEST(NcclTimeout, DefaultEnvironmentAndBadValues) {
  EXPECT_EQ(ddp::nccl_timeout_seconds({}), 600);
  EXPECT_EQ(ddp::nccl_timeout_seconds({{"DDP_NCCL_TIMEOUT_SECONDS", ""}}), 600);
  EXPECT_EQ(ddp::nccl_timeout_seconds({{"DDP_NCCL_TIMEOUT_SECONDS", "30"}}), 30);
  for (const char* bad : {"0", "-5", "ten", "1.5"}) {
    try {
      ddp::nccl_timeout_seconds({{"DDP_NCCL_TIMEOUT_SECONDS", bad}});
      FAIL() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), std::string("DDP_NCCL_TIMEOUT_SECONDS='") + bad + "'"))
          << e.what();
    }
  }
}

TEST(CollectiveTimeout, OneVariableForBothBackendsNcclsOwnStillWins) {
  EXPECT_EQ(ddp::collective_timeout_seconds({}), 600);
  EXPECT_EQ(ddp::collective_timeout_seconds({{"DDP_TIMEOUT_SECONDS", "5"}}), 5);
  EXPECT_EQ(ddp::nccl_timeout_seconds({{"DDP_TIMEOUT_SECONDS", "5"}}), 5);
  EXPECT_EQ(
      ddp::nccl_timeout_seconds({{"DDP_TIMEOUT_SECONDS", "5"}, {"DDP_NCCL_TIMEOUT_SECONDS", "30"}}),
      30);
  for (const char* bad : {"0", "-5", "ten", "1.5"}) {
    try {
      ddp::collective_timeout_seconds({{"DDP_TIMEOUT_SECONDS", bad}});
      FAIL() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), std::string("DDP_TIMEOUT_SECONDS='") + bad + "'")) << e.what();
    }
  }
}

TEST(DebugMode, DetailOffOrAnErrorNamingTheVariable) {
  EXPECT_FALSE(ddp::debug_detail({}));
  EXPECT_FALSE(ddp::debug_detail({{"DDP_DEBUG", ""}}));
  EXPECT_FALSE(ddp::debug_detail({{"DDP_DEBUG", "OFF"}}));
  EXPECT_TRUE(ddp::debug_detail({{"DDP_DEBUG", "DETAIL"}}));
  try {
    ddp::debug_detail({{"DDP_DEBUG", "verbose"}});
    FAIL() << "accepted verbose";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "DDP_DEBUG='verbose': expected DETAIL")) << e.what();
  }
}

TEST(ResolveBackend, AutoPicksNcclOnlyForAModelOnTheRanksGpuInANcclBuild) {
  using ddp::Backend;
  EXPECT_EQ(ddp::resolve_backend(Backend::Auto, cuda(0), cuda(0), true), Backend::Nccl);
  EXPECT_EQ(ddp::resolve_backend(Backend::Auto, cuda(0), cuda(0), false), Backend::Mpi);
  EXPECT_EQ(ddp::resolve_backend(Backend::Auto, kCpu, cuda(0), true), Backend::Mpi);
  EXPECT_EQ(ddp::resolve_backend(Backend::Auto, kCpu, kCpu, true), Backend::Mpi);
  EXPECT_EQ(ddp::resolve_backend(Backend::Auto, cuda(1), cuda(0), true), Backend::Mpi);
  EXPECT_EQ(ddp::resolve_backend(Backend::Mpi, cuda(0), cuda(0), true), Backend::Mpi);
  EXPECT_EQ(ddp::resolve_backend(Backend::Nccl, cuda(0), cuda(0), true), Backend::Nccl);
}

TEST(ResolveBackend, AnExplicitNcclThatCannotWorkNamesTheOptionAndWhy) {
  auto error = [](torch::Device params, torch::Device rank, bool built) {
    try {
      ddp::resolve_backend(ddp::Backend::Nccl, params, rank, built);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  const std::string on_cpu = error(kCpu, kCpu, true);
  EXPECT_TRUE(contains(on_cpu, "DDPOptions::backend is nccl, but the parameters are on cpu"))
      << on_cpu;
  const std::string not_built = error(cuda(0), cuda(0), false);
  EXPECT_TRUE(contains(not_built, "DDPOptions::backend is nccl")) << not_built;
  EXPECT_TRUE(contains(not_built, "no NCCL communicator")) << not_built;
  const std::string other_gpu = error(cuda(1), cuda(0), true);
  EXPECT_TRUE(contains(other_gpu, "on cuda:1")) << other_gpu;
  EXPECT_TRUE(contains(other_gpu, "works on cuda:0")) << other_gpu;
}

TEST(ParseBackend, NamesAndTheBadValue) {
  EXPECT_EQ(ddp::parse_backend("auto"), ddp::Backend::Auto);
  EXPECT_EQ(ddp::parse_backend("mpi"), ddp::Backend::Mpi);
  EXPECT_EQ(ddp::parse_backend("nccl"), ddp::Backend::Nccl);
  EXPECT_STREQ(ddp::backend_name(ddp::Backend::Nccl), "nccl");
  try {
    ddp::parse_backend("gloo");
    FAIL() << "accepted gloo";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "'gloo'")) << e.what();
  }
}

}  // namespace

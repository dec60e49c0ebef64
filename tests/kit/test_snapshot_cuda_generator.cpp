// The snapshot's CUDA generator entry ("cuda_generator_states", snapshot.h), on the CPU: written
// through the test seam train/snapshot_cuda.h with a made-up state per rank, it round-trips; a
// file without it (a CPU run's) loads; one with it loads on ranks that compute on the CPU, rank 0
// warning that the states are not restored. The GPU side (the real generator restored) runs in
// scripts/gpu_proof.sh's mid-epoch resume on the GPU.
#include <ddp/train/snapshot.h>

#include "train/snapshot_cuda.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <string>

namespace test_snapshot_cuda_generator {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::Communicator& comm() { return ddp_test::group().cpu(); }

// A directory every rank names the same (rank 0's), created by rank 0.
std::string shared_dir(const std::string& name) {
  std::string mine = rt().is_main() ? ddp_test::make_temp_dir(name) : std::string();
  return ddp::all_gather_strings(comm(), mine)[0];
}

// 16 bytes, as LibTorch's CUDA generator state (seed and offset), different on every rank.
torch::Tensor fake_cuda_state() {
  return torch::arange(16, torch::kLong).add(10 * rt().rank()).to(torch::kByte);
}

struct Fixture {
  torch::nn::Linear net{4, 3};
  torch::optim::SGD sgd{net->parameters(), torch::optim::SGDOptions(0.1)};
  ddp::TrainingProgress progress() const {
    ddp::TrainingProgress p;
    p.epoch = 1;
    p.global_step = 7;
    p.world_size = rt().world_size();
    p.batches_done = 3;  // inside an epoch: the generators matter most there
    return p;
  }
};

// The fixture's model and optimizer as the snapshot's parts.
ddp::SnapshotParts parts(Fixture& f) {
  return ddp::SnapshotParts{{{"", f.net.get()}}, {{"", &f.sgd}}};
}

ddp::detail::SavedCudaGenerator load_with(const std::string& path) {
  Fixture f;
  ddp::detail::SavedCudaGenerator saved;
  ddp::detail::load_snapshot_with(path, comm(), parts(f), nullptr, nullptr, {}, saved);
  return saved;
}

TEST(SnapshotCudaGenerator, EntryRoundTripsWithAndWithoutIt) {
  const std::string dir = shared_dir("snapshot_cuda_round_trip");
  Fixture f;
  const std::string with = dir + "/with.pt", without = dir + "/without.pt";
  ddp::detail::save_snapshot_with(with, comm(), parts(f), f.progress(), {}, {}, fake_cuda_state());
  ddp::detail::save_snapshot_with(without, comm(), parts(f), f.progress(), {}, {}, torch::Tensor());
  const ddp::detail::SavedCudaGenerator a = load_with(with), b = load_with(without);
  EXPECT_TRUE(a.in_file);
  ASSERT_TRUE(a.state.defined());
  EXPECT_TRUE(torch::equal(a.state, fake_cuda_state())) << a.state;  // this rank's own row
  EXPECT_FALSE(b.in_file);
  EXPECT_FALSE(b.state.defined());
}

// A CPU run's snapshot (save_snapshot on a CPU model) has no entry, and loads as before: the
// model, the position and the CPU generator come back.
TEST(SnapshotCudaGenerator, CpuRunsWriteNoEntryAndTheirFilesLoad) {
  const std::string path = shared_dir("snapshot_cuda_cpu") + "/cpu.pt";
  torch::manual_seed(5);
  Fixture saved;
  torch::manual_seed(100 + rt().rank());
  ddp::save_snapshot(path, comm(), ddp_test::one_model(*saved.net, saved.sgd), saved.progress());
  const torch::Tensor draws = torch::rand({4});
  EXPECT_FALSE(load_with(path).in_file);

  torch::manual_seed(6);
  Fixture resumed;
  const ddp::TrainingProgress p =
      ddp::load_snapshot(path, comm(), ddp_test::one_model(*resumed.net, resumed.sgd), nullptr);
  EXPECT_EQ(p.global_step, 7);
  EXPECT_EQ(p.batches_done, 3);
  EXPECT_TRUE(torch::equal(resumed.net->weight, saved.net->weight));
  EXPECT_TRUE(torch::equal(torch::rand({4}), draws)) << "the CPU generator was not restored";
}

// A GPU run's snapshot resumed on ranks without a GPU: it loads (the model and optimizer do not
// depend on the device, and the CPU generators are restored), and rank 0 says that the CUDA
// generator states were not.
TEST(SnapshotCudaGenerator, GpuSnapshotLoadsOnTheCpuWithAWarning) {
  const std::string path = shared_dir("snapshot_cuda_on_cpu") + "/gpu.pt";
  torch::manual_seed(5);
  Fixture saved;
  torch::manual_seed(200 + rt().rank());
  ddp::detail::save_snapshot_with(path, comm(), parts(saved), saved.progress(), {}, {},
                                  fake_cuda_state());
  const torch::Tensor draws = torch::rand({4});

  torch::manual_seed(6);
  Fixture resumed;
  testing::internal::CaptureStderr();
  ddp::load_snapshot(path, comm(), ddp_test::one_model(*resumed.net, resumed.sgd), nullptr);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(torch::equal(resumed.net->weight, saved.net->weight));
  EXPECT_TRUE(torch::equal(torch::rand({4}), draws)) << "the CPU generator was not restored";
  if (rt().is_main()) {
    EXPECT_NE(err.find("Warning: " + path + " holds the CUDA generator states"), std::string::npos)
        << err;
    EXPECT_NE(err.find("not restored"), std::string::npos) << err;
  } else {
    EXPECT_EQ(err, "");  // once, not once per rank
  }
}

// Ranks that disagree on CUDA cannot be saved together; every rank gets the error.
TEST(SnapshotCudaGenerator, RanksMixingCpuAndCudaAreRefusedOnEveryRank) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string path = shared_dir("snapshot_cuda_mixed") + "/mixed.pt";
  Fixture f;
  try {
    ddp::detail::save_snapshot_with(path, comm(), parts(f), f.progress(), {}, {},
                                    rt().rank() == 1 ? fake_cuda_state() : torch::Tensor());
    FAIL() << "no exception on rank " << rt().rank();
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 0 on the CPU, rank 1 on CUDA"), std::string::npos) << msg;
  }
}

}  // namespace test_snapshot_cuda_generator

#include <ddp/util/checkpoint.h>
#include <ddp/runtime/runtime.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fstream>

namespace {

TEST(SelectDevice, CpuWhenCudaIsOffOrAbsent) {
  EXPECT_EQ(ddp::select_device(false, 4, 1, 2), torch::Device(torch::kCPU));
  EXPECT_EQ(ddp::select_device(true, 0, 1, 2), torch::Device(torch::kCPU));
}

TEST(SelectDevice, LocalRankPicksItsGpu) {
  EXPECT_EQ(ddp::select_device(true, 4, 3, 4), torch::Device(torch::kCUDA, 3));
  EXPECT_EQ(ddp::select_device(true, 4, 0, 2), torch::Device(torch::kCUDA, 0));
}

TEST(SelectDevice, MoreRanksThanGpusIsAClearError) {
  try {
    ddp::select_device(true, 1, 1, 2);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("2 ranks on this node but only 1 visible CUDA device"),
              std::string::npos) << e.what();
  }
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(WriteAtomically, ReplacesTheFileOnlyWhenTheWriteSucceeds) {
  const std::string dir = ddp_test::make_temp_dir("atomic");
  const std::string path = dir + "/state.txt";
  ddp::write_atomically(path, [](const std::string& tmp) { std::ofstream(tmp) << "first"; });
  EXPECT_EQ(read_all(path), "first");

  EXPECT_THROW(ddp::write_atomically(path,
                                     [](const std::string& tmp) {
                                       std::ofstream(tmp) << "half";
                                       throw std::runtime_error("disk full");
                                     }),
               std::runtime_error);
  EXPECT_EQ(read_all(path), "first");
  EXPECT_EQ(ddp_test::run_command("ls '" + dir + "'"), "state.txt\n");  // no temporary left
}

TEST(WriteAtomically, UnwritableDirectoryNamesTheFile) {
  try {
    ddp::save_module(*torch::nn::Linear(2, 2), "/nonexistent-dir/model.pt");
    FAIL() << "no exception";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/model.pt"), std::string::npos) << e.what();
  }
}

TEST(SaveModule, RoundTripsThroughTorchLoad) {
  const std::string path = ddp_test::make_temp_dir("save_module") + "/linear.pt";
  torch::nn::Linear saved(3, 2), loaded(3, 2);
  ddp::save_module(*saved, path);
  torch::load(loaded, path);
  EXPECT_TRUE(torch::equal(saved->weight, loaded->weight));
  EXPECT_TRUE(torch::equal(saved->bias, loaded->bias));
}

}  // namespace

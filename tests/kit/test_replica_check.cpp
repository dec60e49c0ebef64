#include <ddp/checkpoint_file.h>
#include <ddp/train/replica_check.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace test_replica_check {

// What every buffer mismatch adds: why a correct run can meet one.
const std::string kBufferHint =
    "; a buffer (BatchNorm's running statistics) is each rank's own after a training forward, as "
    "in PyTorch, until DistributedDataParallel::prepare_forward() (or the wrapper's next training "
    "forward) broadcasts rank 0's: check after that call";

ddp::Communicator& comm() { return ddp_test::group().cpu(); }

// 6 parameters (fc1, norm, fc2: weight and bias each), 3 buffers (norm's), plus "extra".
struct Net : torch::nn::Module {
  explicit Net(int64_t hidden = 8, bool extra_buffer = false)
      : fc1(register_module("fc1", torch::nn::Linear(6, hidden))),
        norm(register_module("norm", torch::nn::BatchNorm1d(hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 3))) {
    if (extra_buffer) register_buffer("extra", torch::zeros({2}));
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear fc2;
};

// The same initialisation on every rank.
std::shared_ptr<Net> make_net(int64_t hidden = 8, bool extra_buffer = false) {
  torch::manual_seed(5);
  return std::make_shared<Net>(hidden, extra_buffer);
}

// The message check_replicas_in_sync throws ("" when it returns), after checking that every
// rank got the same one.
std::string mismatch_message(const Net& net, const std::string& context = "") {
  std::string msg;
  try {
    ddp::check_replicas_in_sync(net, comm(), context);
  } catch (const ddp::ReplicaMismatch& e) {
    msg = e.what();
  }
  const auto all = ddp::all_gather_strings(comm(), msg);
  for (int r = 1; r < comm().size(); ++r) EXPECT_EQ(all[r], all[0]) << "rank " << r;
  return msg;
}

TEST(TensorHash, EveryBitShapeAndDtypeChangeTheHash) {
  // 79 bytes: two 32-byte blocks, then the 8-byte, 4-byte and 1-byte tails.
  const torch::Tensor bytes = torch::arange(79, torch::kByte);
  std::set<uint64_t> seen{ddp::tensor_hash(bytes)};
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      torch::Tensor flipped = bytes.clone();
      flipped.data_ptr<uint8_t>()[i] ^= static_cast<uint8_t>(1 << bit);
      seen.insert(ddp::tensor_hash(flipped));
    }
  }
  EXPECT_EQ(seen.size(), 1u + 79u * 8u);

  const torch::Tensor t = torch::arange(16, torch::kFloat);
  EXPECT_NE(ddp::tensor_hash(t.view({16, 1})), ddp::tensor_hash(t));
  EXPECT_NE(ddp::tensor_hash(t.view({16, 1})), ddp::tensor_hash(t.view({1, 16})));
  EXPECT_NE(ddp::tensor_hash(t.view(torch::kInt)), ddp::tensor_hash(t));  // same bytes
  EXPECT_NE(ddp::tensor_hash(torch::tensor({0.0f})), ddp::tensor_hash(torch::tensor({-0.0f})));
  EXPECT_NE(ddp::tensor_hash(torch::empty({0})), ddp::tensor_hash(torch::empty({0, 3})));
  EXPECT_NE(ddp::tensor_hash(torch::Tensor()), ddp::tensor_hash(torch::empty({0})));
}

TEST(TensorHash, SameForEqualBitsInAnyLayoutProcessAndRun) {
  const torch::Tensor t = torch::arange(12, torch::kFloat).reshape({3, 4});
  const uint64_t h = ddp::tensor_hash(t);
  EXPECT_EQ(ddp::tensor_hash(t.clone()), h);
  const torch::Tensor strided = t.t().contiguous().t();
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_EQ(ddp::tensor_hash(strided), h);
  EXPECT_EQ(ddp::tensor_hash(t.clone().requires_grad_()), h);
  // Pinned, so that hashes logged by one run can be compared with another's.
  EXPECT_EQ(h, 0xb0477c92c2e34e75ULL);
  const torch::Tensor all =
      comm().all_gather(torch::tensor({static_cast<int64_t>(h)}, torch::kLong));
  EXPECT_TRUE(torch::equal(all, torch::full_like(all, static_cast<int64_t>(h))));
}

TEST(CheckReplicasInSync, IdenticalReplicasPass) {
  auto net = make_net();
  EXPECT_EQ(mismatch_message(*net, "at step 1"), "");
}

TEST(CheckReplicasInSync, PerturbedParameterIsNamedOnEveryRank) {
  if (comm().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int last = comm().size() - 1;
  auto net = make_net();
  {
    torch::NoGradGuard no_grad;
    net->fc2->weight[0][1].fill_(0.5f);
    // A buffer differs too, but parameters come first.
    if (comm().rank() == last) {
      net->fc2->weight[0][1].add_(1e-7);
      net->norm->running_var[0].fill_(2.0f);
    }
  }
  EXPECT_EQ(mismatch_message(*net, "at step 7"),
            "replicas differ at step 7: parameter 'fc2.weight' differs from rank 0 on rank(s) " +
                std::to_string(last) + " (max abs difference 1.19209e-07)");
}

TEST(CheckReplicasInSync, PerturbedBufferIsNamedWithEveryDifferingRank) {
  if (comm().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = make_net();
  std::string odd_ranks;
  for (int r = 1; r < comm().size(); r += 2)
    odd_ranks += (odd_ranks.empty() ? "" : ", ") + std::to_string(r);
  if (comm().rank() % 2 == 1) {
    torch::NoGradGuard no_grad;
    net->norm->running_var[2].fill_(1.25f);
  }
  EXPECT_EQ(mismatch_message(*net),
            "replicas differ: buffer 'norm.running_var' differs from rank 0 on rank(s) " +
                odd_ranks + " (max abs difference 0.25)" + kBufferHint);
}

TEST(CheckReplicasInSync, BitLevelDifferenceIsCaught) {
  if (comm().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int last = comm().size() - 1;
  auto net = make_net();
  if (comm().rank() == last) {
    torch::NoGradGuard no_grad;
    net->norm->running_mean[0].fill_(-0.0f);  // equal to 0.0 as a number
  }
  EXPECT_EQ(mismatch_message(*net),
            "replicas differ: buffer 'norm.running_mean' differs from rank 0 on rank(s) " +
                std::to_string(last) + " (max abs difference 0)" + kBufferHint);
}

TEST(CheckReplicasInSync, DifferentShapesAreReportedNotGathered) {
  if (comm().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int last = comm().size() - 1;
  auto net = make_net(comm().rank() == last ? 9 : 8);
  EXPECT_EQ(
      mismatch_message(*net, "after loading"),
      "replicas differ after loading: parameter 'fc1.weight' differs from rank 0 on rank(s) " +
          std::to_string(last) + " (rank 0: parameter 'fc1.weight' Float [8, 6]; rank " +
          std::to_string(last) + ": parameter 'fc1.weight' Float [9, 6])");
}

TEST(CheckReplicasInSync, DifferentTensorCountsAreReported) {
  if (comm().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int last = comm().size() - 1;
  auto net = make_net(8, comm().rank() == last);
  EXPECT_EQ(mismatch_message(*net),
            "replicas differ: the modules differ in structure: rank 0 has 6 parameters and 3 "
            "buffers, rank " +
                std::to_string(last) + " has 6 parameters and 4 buffers");
}

// Every rank works in its own directory (make_temp_dir names it after the process).
struct StateFiles {
  StateFiles() : dir(ddp_test::make_temp_dir("compare_state_files")) {}
  std::string save(const Net& net, const std::string& name) const {
    const std::string path = dir + "/" + name;
    ddp::save_module(net, path);
    return path;
  }
  std::string dir;
};

TEST(CompareStateFiles, ReportsExactlyTheTensorsThatDiffer) {
  const StateFiles files;
  auto net = make_net();
  torch::NoGradGuard no_grad;
  net->fc1->bias[1].fill_(1.0f);
  const std::string a = files.save(*net, "a.pt"), a_again = files.save(*net, "a_again.pt");
  net->norm->running_mean[2].fill_(-0.0f);  // a buffer, only its bits differ
  net->fc1->bias[1].fill_(1.5f);            // a parameter
  const std::string b = files.save(*net, "b.pt");

  const auto differences = ddp::compare_state_files(a, b);
  ASSERT_EQ(differences.size(), 2u);
  EXPECT_EQ(differences[0].name, "fc1.bias");
  EXPECT_EQ(differences[0].what, "max abs difference 0.5 (1 of 8 elements differ)");
  EXPECT_EQ(differences[0].max_abs_diff, 0.5);
  EXPECT_EQ(differences[1].name, "norm.running_mean");
  EXPECT_EQ(differences[1].what, "max abs difference 0 (1 of 8 elements differ)");
  EXPECT_EQ(differences[1].max_abs_diff, 0.0);

  EXPECT_TRUE(ddp::compare_state_files(a, a_again).empty());
  EXPECT_TRUE(ddp::compare_state_files(b, b).empty());
}

TEST(CompareStateFiles, NaNsCompareByTheirBits) {
  const StateFiles files;
  auto net = make_net();
  torch::NoGradGuard no_grad;
  auto set_bias = [&](std::initializer_list<uint32_t> bits) {
    std::copy(bits.begin(), bits.end(),
              reinterpret_cast<uint32_t*>(net->fc2->bias.data_ptr<float>()));
  };
  set_bias({0x7fc00001, 0x00000000, 0x3f800000});  // NaN (payload 1), 0.0, 1.0
  const std::string a = files.save(*net, "a.pt");
  set_bias({0x7fc00002, 0x00000000, 0x3f800000});  // another NaN payload
  const std::string payload = files.save(*net, "payload.pt");
  set_bias({0x7fc00001, 0x3f800000, 0x3f800000});  // 1.0 where A has 0.0
  const std::string value = files.save(*net, "value.pt");
  set_bias({0x3f800000, 0x00000000, 0x3f800000});  // 1.0 where A has a NaN
  const std::string number = files.save(*net, "number.pt");

  auto only = [&](const std::string& b) {
    const auto differences = ddp::compare_state_files(a, b);
    EXPECT_EQ(differences.size(), 1u) << b;
    return differences.empty() ? ddp::TensorDifference{} : differences[0];
  };
  EXPECT_EQ(only(payload).what, "max abs difference 0 (1 of 3 elements differ)");
  EXPECT_EQ(only(value).what, "max abs difference 1 (1 of 3 elements differ)");  // the NaNs agree
  EXPECT_TRUE(std::isnan(only(number).max_abs_diff));
  EXPECT_EQ(only(number).name, "fc2.bias");
}

TEST(CompareStateFiles, MissingTensorsShapesAndDtypes) {
  const StateFiles files;
  const std::string base = files.save(*make_net(), "base.pt");
  const std::string extra = files.save(*make_net(8, true), "extra.pt");
  const std::string wider = files.save(*make_net(9), "wider.pt");
  auto doubled = make_net();
  doubled->fc2->to(torch::kDouble);
  const std::string fc2_double = files.save(*doubled, "fc2_double.pt");

  auto names_and_whats = [](const std::vector<ddp::TensorDifference>& differences) {
    std::vector<std::string> lines;
    for (const auto& d : differences) lines.push_back(d.name + "\t" + d.what);
    return lines;
  };
  EXPECT_EQ(names_and_whats(ddp::compare_state_files(base, extra)),
            std::vector<std::string>{"extra\tmissing in A"});
  EXPECT_EQ(names_and_whats(ddp::compare_state_files(extra, base)),
            std::vector<std::string>{"extra\tmissing in B"});
  EXPECT_EQ(names_and_whats(ddp::compare_state_files(base, fc2_double)),
            (std::vector<std::string>{"fc2.weight\tdtype Float vs Double",
                                      "fc2.bias\tdtype Float vs Double"}));
  const auto widened = names_and_whats(ddp::compare_state_files(base, wider));
  ASSERT_FALSE(widened.empty());
  EXPECT_EQ(widened[0], "fc1.weight\tshape [8, 6] vs [9, 6]");
}

TEST(CompareStateFiles, UnreadableFileIsNamed) {
  const StateFiles files;
  const std::string good = files.save(*make_net(), "good.pt");
  const std::string garbage = files.dir + "/garbage.pt", missing = files.dir + "/missing.pt";
  std::ofstream(garbage) << "not an archive";
  for (const auto& [a, b, culprit] :
       {std::make_tuple(good, garbage, garbage), std::make_tuple(missing, good, missing),
        std::make_tuple(good, missing, missing)}) {
    try {
      ddp::compare_state_files(a, b);
      ADD_FAILURE() << "no exception for " << culprit;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(culprit + ": ", 0), 0u) << e.what();
    }
  }
}

// Runs a shell command; returns its exit status and, in `output`, its stdout and stderr.
int run_with_status(const std::string& command, std::string& output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  output.clear();
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CompareModelsTool, PrintsDifferingTensorsAndExitStatus) {
#ifndef DDP_COMPARE_MODELS
  GTEST_SKIP() << "built without the tools (DDP_BUILD_TOOLS=OFF)";
#else
  if (comm().rank() != 0) GTEST_SKIP() << "the tool runs on rank 0";
  const StateFiles files;
  auto net = make_net();
  const std::string a = files.save(*net, "a.pt"), a_again = files.save(*net, "a_again.pt");
  {
    torch::NoGradGuard no_grad;
    net->norm->running_var.fill_(2.0f);
  }
  const std::string b = files.save(*net, "b.pt");
  const std::string tool = DDP_COMPARE_MODELS;

  std::string output;
  EXPECT_EQ(run_with_status(tool + " " + a + " " + a_again, output), 0) << output;
  EXPECT_EQ(output, "identical: " + a + " " + a_again + "\n");
  EXPECT_EQ(run_with_status(tool + " " + a + " " + a_again + " " + b, output), 1) << output;
  EXPECT_EQ(output,
            "identical: " + a + " " + a_again + "\ndiffer: " + a + " " + b +
                " (1 tensor)\nnorm.running_var\tmax abs difference 1 (8 of 8 elements differ)\n");
#endif
}

}  // namespace test_replica_check

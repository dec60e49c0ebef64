#include <ddp/train/adadelta.h>
#include <ddp/train/lr_scheduler.h>
#include <ddp/train/snapshot.h>

#include "test_support.h"

#include <ATen/CPUGeneratorImpl.h>

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fstream>

namespace test_snapshot {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }
ddp::Communicator& comm() { return pg().cpu(); }

struct Net : torch::nn::Module {
  explicit Net(int64_t hidden = 8)
      : fc1(register_module("fc1", torch::nn::Linear(4, hidden))),
        norm(register_module("norm", torch::nn::BatchNorm1d(hidden))),
        drop(register_module("drop", torch::nn::Dropout(0.3))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(drop(torch::relu(norm(fc1(x))))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};

// One training step; dropout draws from the global generator, so it tests the RNG restore.
void step(Net& net, torch::optim::Optimizer& optimizer) {
  torch::Tensor x = torch::sin(torch::arange(24, torch::kFloat).reshape({6, 4}));
  optimizer.zero_grad();
  net.forward(x).pow(2).sum().backward();
  optimizer.step();
}

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  for (const auto& b : m.buffers()) parts.push_back(b.detach().flatten().to(torch::kFloat));
  return torch::cat(parts);
}

// A directory every rank names the same (rank 0's), created by rank 0.
std::string shared_dir(const std::string& name) {
  std::string mine = rt().is_main() ? ddp_test::make_temp_dir(name) : std::string();
  return ddp::all_gather_strings(comm(), mine)[0];
}

torch::optim::SGD make_sgd(Net& net) {
  return torch::optim::SGD(net.parameters(),
                           torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
}

// Expects load_snapshot(path) to throw on every rank with `path` and `why` in the message.
void expect_load_fails(const std::string& path, const std::string& why) {
  torch::manual_seed(1);
  Net net;
  auto sgd = make_sgd(net);
  const torch::Tensor before = flat(net).clone();
  try {
    ddp::load_snapshot(path, comm(), ddp_test::one_model(net, sgd), nullptr);
    ADD_FAILURE() << "loading " << path << " did not fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(flat(net), before)) << "a failed load modified the model";
}

TEST(Snapshot, ResumedTrainingIsBitIdenticalToUninterrupted) {
  const std::string dir = shared_dir("snapshot_resume");
  // Uninterrupted: 3 "epochs" of 2 steps with a StepLR, snapshot after epoch 2.
  torch::manual_seed(7);  // the same replica on every rank, as DDP keeps it
  Net a;
  auto sgd_a = make_sgd(a);
  ddp::StepLR sched_a(sgd_a, 1, 0.5);
  for (int epoch = 1; epoch <= 3; ++epoch) {
    step(a, sgd_a);
    step(a, sgd_a);
    sched_a.step();
    if (epoch == 2) {
      // From here on each rank's generator, and so its dropout masks, differ: the snapshot
      // must give every rank back its own.
      torch::rand({rt().rank() + 1});
      ddp::TrainingProgress progress{2, 4, 42, rt().world_size()};
      ddp::save_snapshot(ddp::snapshot_path(dir, 2), comm(), ddp_test::one_model(a, sgd_a),
                         progress);
    }
  }

  const torch::Tensor draws_a = torch::rand({8});  // the generator after epoch 3

  // Resumed: a fresh model (another initialisation), optimizer and scheduler.
  torch::manual_seed(1000);
  Net b;
  auto sgd_b = make_sgd(b);
  ddp::StepLR sched_b(sgd_b, 1, 0.5);
  const ddp::TrainingProgress p = ddp::load_snapshot(ddp::snapshot_path(dir, 2), comm(),
                                                     ddp_test::one_model(b, sgd_b), &sched_b);
  EXPECT_EQ(p.epoch, 2);
  EXPECT_EQ(p.global_step, 4);
  EXPECT_EQ(p.seed, 42);
  EXPECT_EQ(p.world_size, rt().world_size());
  step(b, sgd_b);
  step(b, sgd_b);
  sched_b.step();
  EXPECT_TRUE(torch::equal(flat(a), flat(b)));
  EXPECT_EQ(sgd_a.param_groups()[0].options().get_lr(), sgd_b.param_groups()[0].options().get_lr());
  EXPECT_EQ(sgd_b.param_groups()[0].options().get_lr(), 0.1 * 0.5 * 0.5 * 0.5);
  // The generator continued where this rank's left off: dropout drew the same masks above, and
  // the next draw is the same too.
  EXPECT_TRUE(torch::equal(torch::rand({8}), draws_a));
}

TEST(Snapshot, DamagedOrForeignSnapshotsAreRefusedNamingTheFile) {
  const std::string dir = shared_dir("snapshot_bad");
  torch::manual_seed(3);
  Net net;
  auto sgd = make_sgd(net);
  step(net, sgd);
  const std::string good = ddp::snapshot_path(dir, 1);
  ddp::save_snapshot(good, comm(), ddp_test::one_model(net, sgd), {1, 1, 1, rt().world_size()});

  std::string bytes;
  if (rt().is_main()) {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::ofstream(dir + "/truncated.pt", std::ios::binary).write(bytes.data(), bytes.size() / 2);
    std::string flipped = bytes;
    flipped[flipped.size() - 100] ^= 0x10;
    std::ofstream(dir + "/flipped.pt", std::ios::binary).write(flipped.data(), flipped.size());
    std::ofstream(dir + "/empty.pt", std::ios::binary).flush();
  }
  comm().barrier();
  expect_load_fails(dir + "/missing.pt", "cannot read");
  expect_load_fails(dir + "/truncated.pt", "truncated");
  expect_load_fails(dir + "/flipped.pt", "corrupted");
  expect_load_fails(dir + "/empty.pt", "not a ddp training snapshot");

  // Another model: the first differing entry is named.
  {
    Net wider(9);
    auto sgd_wider = make_sgd(wider);
    try {
      ddp::load_snapshot(good, comm(), ddp_test::one_model(wider, sgd_wider), nullptr);
      ADD_FAILURE() << "a snapshot of another model loaded";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("different model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
    }
  }
  // Another optimizer.
  {
    Net same;
    ddp::Adadelta adadelta(same.parameters());
    try {
      ddp::load_snapshot(good, comm(), ddp_test::one_model(same, adadelta), nullptr);
      ADD_FAILURE() << "a snapshot of another optimizer loaded";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("torch::optim::SGD"), std::string::npos) << e.what();
    }
  }
}

// The inputs kept in fuzz/corpus/snapshot/ (seeds and inputs that found bugs), and a
// directory, through the real reader: each is refused naming the file, nothing is modified.
TEST(Snapshot, FuzzCorpusAndDirectoriesAreRefusedNamingTheFile) {
  const std::string corpus = std::string(DDP_TEST_DIR) + "/../fuzz/corpus/snapshot/";
  int replayed = 0;
  for (const char* name : {"seed-format-1", "seed-promises-2-63-bytes", "seed-header-bad-hash",
                           "seed-progress-record", "bug-negative-epoch"}) {
    expect_load_fails(corpus + name, "");
    ++replayed;
  }
  EXPECT_EQ(replayed, 5);
  expect_load_fails(corpus + "seed-promises-2-63-bytes", "truncated or padded");
  expect_load_fails(corpus + "seed-format-1", "format 1");
  expect_load_fails(corpus, "not a regular file: it is a directory");
}

TEST(Snapshot, ListsSnapshotsNewestPositionFirst) {
  const std::string dir = ddp_test::make_temp_dir("snapshot_list");
  for (const char* name :
       {"snapshot_epoch2.pt", "snapshot_epoch10.pt", "snapshot_epoch9.pt", "snapshot_epochx.pt",
        "model_with_epoch11.pt", "snapshot_epoch3.pt.tmp.1", "snapshot_epoch10_batch7.pt",
        "snapshot_epoch10_batch30.pt", "snapshot_epoch11_batch2.pt", "snapshot_epoch3_batchx.pt",
        "snapshot_epoch3_batch.pt"}) {
    std::ofstream(dir + "/" + name) << "x";
  }
  // Inside epoch 11 after 2 batches is newer than the end of epoch 10, which is newer than
  // anything inside epoch 10.
  EXPECT_EQ(ddp::list_snapshots(dir),
            (std::vector<std::string>{
                dir + "/snapshot_epoch11_batch2.pt", dir + "/snapshot_epoch10.pt",
                dir + "/snapshot_epoch10_batch30.pt", dir + "/snapshot_epoch10_batch7.pt",
                dir + "/snapshot_epoch9.pt", dir + "/snapshot_epoch2.pt"}));
  EXPECT_EQ(ddp::snapshot_path("d", 4, 17), "d/snapshot_epoch4_batch17.pt");
  EXPECT_TRUE(ddp::list_snapshots(dir + "/absent").empty());
}

TEST(Snapshot, InsideAnEpochEachRankGetsItsOwnStateBack) {
  const std::string dir = shared_dir("snapshot_inside_epoch");
  const std::string path = ddp::snapshot_path(dir, 2, 3);
  torch::manual_seed(5);
  Net net;
  auto sgd = make_sgd(net);
  step(net, sgd);
  // A generator that has drawn differently on every rank, as the augmentation's does.
  at::Generator augment = at::make_generator<at::CPUGeneratorImpl>(100 + rt().rank());
  torch::rand({rt().rank() + 3}, augment);
  ddp::RankState mine;
  mine.generator = augment.get_state();
  mine.values = torch::tensor({0.25 + rt().rank(), 7.0 * rt().rank(), 1e-300}, torch::kDouble);
  const ddp::TrainingProgress written{1, 9, 42, rt().world_size(), 3};
  ddp::save_snapshot(path, comm(), ddp_test::one_model(net, sgd), written, mine);
  const torch::Tensor next_draws = torch::rand({4}, augment);

  torch::manual_seed(6);
  Net other;
  auto sgd_other = make_sgd(other);
  ddp::RankState loaded;
  const ddp::TrainingProgress p =
      ddp::load_snapshot(path, comm(), ddp_test::one_model(other, sgd_other), nullptr, &loaded);
  EXPECT_EQ(p.epoch, 1);
  EXPECT_EQ(p.batches_done, 3);
  EXPECT_EQ(p.global_step, 9);
  ASSERT_TRUE(loaded.values.defined());
  EXPECT_TRUE(torch::equal(loaded.values, mine.values)) << loaded.values;
  ASSERT_TRUE(loaded.generator.defined());
  at::Generator restored = at::make_generator<at::CPUGeneratorImpl>(0);
  restored.set_state(loaded.generator);
  EXPECT_TRUE(torch::equal(torch::rand({4}, restored), next_draws));
  EXPECT_TRUE(torch::equal(flat(other), flat(net)));

  // An epoch-end snapshot has no RankState: the caller's is left empty.
  ddp::save_snapshot(ddp::snapshot_path(dir, 1), comm(), ddp_test::one_model(net, sgd),
                     {1, 9, 42, rt().world_size()});
  ddp::RankState none;
  none.values = torch::ones({1});
  EXPECT_EQ(ddp::load_snapshot(ddp::snapshot_path(dir, 1), comm(),
                               ddp_test::one_model(other, sgd_other), nullptr, &none)
                .batches_done,
            0);
  EXPECT_FALSE(none.values.defined());
  EXPECT_FALSE(none.generator.defined());
}

TEST(Snapshot, InsideAnEpochOnlyTheSameWorldSizeResumes) {
  const std::string dir = shared_dir("snapshot_world_size");
  torch::manual_seed(5);
  Net net;
  auto sgd = make_sgd(net);
  const std::string inside = ddp::snapshot_path(dir, 2, 3);
  // As if written by one rank more than this run has.
  ddp::save_snapshot(inside, comm(), ddp_test::one_model(net, sgd),
                     {1, 9, 42, rt().world_size() + 1, 3});
  expect_load_fails(inside, "taken inside epoch 2 (after 3 batches) by " +
                                std::to_string(rt().world_size() + 1) + " rank(s)");
  // At an epoch end another world size only changes the data order (the Trainer warns).
  const std::string end = ddp::snapshot_path(dir, 1);
  ddp::save_snapshot(end, comm(), ddp_test::one_model(net, sgd),
                     {1, 9, 42, rt().world_size() + 1, 0});
  EXPECT_EQ(ddp::load_snapshot(end, comm(), ddp_test::one_model(net, sgd), nullptr).world_size,
            rt().world_size() + 1);
}

TEST(Snapshot, InsideAnEpochAnotherWorldSizeResumesWhenTheSamplesAreRecorded) {
  const std::string dir = shared_dir("snapshot_other_world_size");
  torch::manual_seed(5);
  Net net;
  auto sgd = make_sgd(net);
  step(net, sgd);
  const std::string inside = ddp::snapshot_path(dir, 2, 3);
  // As if written by one rank more than this run has, after 3 batches of 16 per rank.
  ddp::TrainingProgress written{1, 9, 42, rt().world_size() + 1, 3};
  written.batch_size = 16;
  written.samples_done = 3 * 16 * (rt().world_size() + 1);
  ddp::RankState mine;
  mine.values = torch::tensor({1.0, 2.0}, torch::kDouble);
  ddp::save_snapshot(inside, comm(), ddp_test::one_model(net, sgd), written, mine);

  torch::manual_seed(6);
  Net other;
  auto sgd_other = make_sgd(other);
  ddp::RankState loaded;
  const ddp::TrainingProgress p =
      ddp::load_snapshot(inside, comm(), ddp_test::one_model(other, sgd_other), nullptr, &loaded);
  EXPECT_EQ(p.world_size, rt().world_size() + 1);
  EXPECT_EQ(p.batches_done, 3);
  EXPECT_EQ(p.batch_size, 16);
  EXPECT_EQ(p.samples_done, written.samples_done);
  EXPECT_TRUE(torch::equal(flat(other), flat(net)));
  // Per-rank state cannot go to another count of ranks: none is handed back.
  EXPECT_FALSE(loaded.values.defined());
  EXPECT_FALSE(loaded.generator.defined());
  // An epoch end records 0 samples done and the batch size as given.
  ddp::TrainingProgress end{2, 12, 42, rt().world_size()};
  end.batch_size = 8;
  end.samples_done = 0;
  ddp::save_snapshot(ddp::snapshot_path(dir, 2), comm(), ddp_test::one_model(net, sgd), end);
  const ddp::TrainingProgress q = ddp::load_snapshot(
      ddp::snapshot_path(dir, 2), comm(), ddp_test::one_model(other, sgd_other), nullptr);
  EXPECT_EQ(q.batch_size, 8);
  EXPECT_EQ(q.samples_done, 0);
}

TEST(Snapshot, OlderFormatsAreRefusedSayingSo) {
  const std::string dir = shared_dir("snapshot_formats");
  if (rt().is_main()) {
    for (const char* magic : {"DDPSNAP1", "DDPSNAP2"}) {
      std::string bytes(magic);
      bytes += std::string(64, '\0');
      std::ofstream(dir + "/" + magic + ".pt", std::ios::binary).write(bytes.data(), bytes.size());
    }
  }
  comm().barrier();
  expect_load_fails(dir + "/DDPSNAP1.pt", "a snapshot of format 1 (DDPSNAP1");
  expect_load_fails(dir + "/DDPSNAP2.pt", "a snapshot of format 2 (DDPSNAP2, epoch ends only)");
  expect_load_fails(dir + "/DDPSNAP2.pt", "this one reads format 3 (DDPSNAP3");
}

}  // namespace test_snapshot

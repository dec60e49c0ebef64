// The training kit's parts as a hand-written loop uses them, at 1, 2 and 4 ranks (issue 24):
// the stop agreement stops every rank before the same step and names the signal and the rank;
// the Checkpointer writes, rotates, removes and resumes snapshots (a loop resumed inside an epoch
// continues bit-identical; one that ends inside an epoch names its weights by the step) and
// names its options in errors; the Reporter's metrics file keeps a
// resumed run's earlier epochs and its log lines show the loss averaged over the ranks; the
// EpochMeter reduces over ranks and refuses another task's sums; BatchRangeSampler gives
// LibTorch's DataLoader (with worker threads) exactly the range of a DistributedSampler's epoch.
#include <ddp/checkpoint_file.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/checkpointer.h>
#include <ddp/train/data_source.h>
#include <ddp/train/metrics.h>
#include <ddp/train/reporter.h>
#include <ddp/train/step_boundary.h>
#include <ddp/train/stop_agreement.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace test_hand_written_loop {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

// A directory every rank names the same (rank 0's), created by rank 0.
std::string shared_dir(const std::string& name) {
  return ddp::all_gather_strings(pg().cpu(),
                                 rt().is_main() ? ddp_test::make_temp_dir(name) : "")[0];
}

std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(StopAgreement, EveryRankStopsBeforeTheSameStepNamingTheSignalAndTheRank) {
  const int last = rt().world_size() - 1;
  ddp::StopAgreement stop(pg(), /*every=*/2);
  int64_t stopped_at = -1;
  for (int64_t step = 0; step < 20; ++step) {
    if (stop.should_stop(step)) {
      stopped_at = step;
      break;
    }
    if (step == 5 && rt().rank() == last) std::raise(SIGUSR2);  // after step 5, on one rank
  }
  ddp::clear_stop_signal();
  EXPECT_EQ(stopped_at, 6) << "checks at steps 0, 2, 4, 6: the first after the signal";
  EXPECT_TRUE(stop.stopping());
  EXPECT_EQ(stop.signal(), SIGUSR2);
  EXPECT_EQ(stop.rank(), last);
  EXPECT_EQ(stop.describe(), "SIGUSR2 (rank " + std::to_string(last) + ")");
  EXPECT_GE(stop.seconds_since_signal(), 0.0);
  EXPECT_TRUE(stop.should_stop(7)) << "a decision stays";
  EXPECT_EQ(message_of([] { ddp::StopAgreement(pg(), -1); }),
            "StopAgreement: every must be >= 0 (got -1)");
}

struct Net : torch::nn::Module {
  Net() : fc(register_module("fc", torch::nn::Linear(3, 2))) {}
  torch::nn::Linear fc;
};

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

// A loop of one's own: each step draws noise from its generator and steps the optimizer; every
// rank's noise differs, as an autoencoder's does, and the wrapper averages the gradients (`net`
// is wrapped), so the replicas stay the same.
void train_steps(Net& net, torch::optim::Optimizer& optimizer, at::Generator& noise, int steps) {
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    const torch::Tensor x = torch::randn({4, 3}, noise);
    net.fc(x).pow(2).mean().backward();
    optimizer.step();
  }
}

TEST(Checkpointer, AHandWrittenLoopResumedInsideAnEpochContinuesBitIdentical) {
  const std::string dir = shared_dir("checkpointer_resume");
  ddp::CheckpointerOptions options;
  options.dir = dir;
  options.every_steps = 3;
  options.seed = 9;
  torch::manual_seed(1);
  auto net_ptr = std::make_shared<Net>();
  Net& net = *net_ptr;
  ddp::DistributedDataParallel wrapped(pg(), net_ptr);
  torch::optim::SGD optimizer(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::Checkpointer checkpointer(pg(), net, optimizer, options);
  at::Generator noise = at::make_generator<at::CPUGeneratorImpl>(100 + rt().rank());
  ddp::EpochMeter meter({"count"}, torch::kCPU);
  std::vector<std::string> written;
  for (int64_t step = 0; step < 8; ++step) {
    const ddp::TrainingPosition at{2, step, step};  // epoch 2, a step per batch
    written.push_back(checkpointer.at_boundary(false, at, [&] {
      return ddp::RankState{noise.get_state(), meter.state()};
    }));
    train_steps(net, optimizer, noise, 1);
    meter.add(torch::tensor(0.5), 4, {torch::tensor(1.0)});
  }
  // Due at steps 3 and 6 (not at 0: nothing trained yet); only the newest is kept.
  EXPECT_EQ(written, (std::vector<std::string>{"", "", "", ddp::snapshot_path(dir, 2, 3), "", "",
                                               ddp::snapshot_path(dir, 2, 6), ""}));
  if (rt().is_main()) {
    EXPECT_FALSE(std::filesystem::exists(ddp::snapshot_path(dir, 2, 3)));
    EXPECT_TRUE(std::filesystem::exists(ddp::snapshot_path(dir, 2, 6)));
  }
  const torch::Tensor final_weights = flat(net).clone();

  // Resumed: a fresh model, optimizer and generator; the loop continues at step 6.
  torch::manual_seed(2);
  auto again_ptr = std::make_shared<Net>();
  Net& again = *again_ptr;
  ddp::DistributedDataParallel again_wrapped(pg(), again_ptr);
  torch::optim::SGD again_optimizer(again.parameters(),
                                    torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::CheckpointerOptions resume = options;
  resume.resume = "latest";
  ddp::Checkpointer resumed(pg(), again, again_optimizer, resume);
  const ddp::ResumePoint start = resumed.resume();
  EXPECT_TRUE(start.resumed());
  EXPECT_EQ(start.path, ddp::snapshot_path(dir, 2, 6));
  EXPECT_EQ(start.position.epoch, 2);
  EXPECT_EQ(start.position.batch, 6);
  EXPECT_EQ(start.position.step, 6);
  EXPECT_EQ(start.epochs_done(), 1);
  EXPECT_EQ(start.seed, 9);
  at::Generator again_noise = at::make_generator<at::CPUGeneratorImpl>(0);
  again_noise.set_state(start.rank_state.generator);
  ddp::EpochMeter again_meter({"count"}, torch::kCPU);
  again_meter.restore(start.rank_state.values);
  train_steps(again, again_optimizer, again_noise, 2);
  EXPECT_TRUE(torch::equal(flat(again), final_weights));
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(final_weights));
  // The sums of the 6 batches before the snapshot came back.
  const ddp::EpochResult r = again_meter.reduce(pg().cpu(), 2);
  EXPECT_EQ(r.samples, 6 * 4 * rt().world_size());
  EXPECT_EQ(r.train_loss, 0.5);
  EXPECT_EQ(r.train_metrics[0].sum, 6.0 * rt().world_size());
  // No step snapshot again at the step it resumed from.
  EXPECT_EQ(resumed.at_boundary(false, {2, 6, 6}, [] { return ddp::RankState{}; }), "");
}

// CheckpointerOptions::every_seconds with a fake clock per rank: only the last rank's clock
// moves (1 s a step), as if it alone were slow; the others never find the timer due. The
// stop check's all-reduce carries the last rank's "due" (at steps 3, 7 and 11), read at the next
// boundary, so every rank takes part in the same snapshots, at steps 4, 8 and 12 (the timer
// restarts at each).
TEST(Checkpointer, TimedSnapshotsAreAgreedOnTheStopCheckSoEveryRankSavesAtTheSameStep) {
  const std::string dir = shared_dir("checkpointer_timed");
  const bool slow = rt().rank() == rt().world_size() - 1;
  double now = 0;
  ddp::CheckpointerOptions options;
  options.dir = dir;
  options.every_seconds = 3;
  options.clock = [&now] { return now; };
  Net net;
  torch::optim::SGD optimizer(net.parameters(), torch::optim::SGDOptions(0.1));
  ddp::StepBoundary boundary(pg(), ddp::Checkpointer(pg(), net, optimizer, options));
  ddp::Checkpointer& checkpointer = boundary.checkpointer();
  ddp::DistributedSampler sampler(100, rt().world_size(), rt().rank(), true, 0);
  boundary.start_epoch(1, sampler, 1);
  std::string steps;           // the steps this rank took part in a snapshot at
  int64_t due_here_at_3 = -1;  // this rank's own timer at step 3
  for (int64_t step = 0; step < 13; ++step) {
    if (step == 3) due_here_at_3 = checkpointer.time_due();
    ASSERT_FALSE(boundary.at_step(step, step, [] { return ddp::RankState{}; }));
    const std::string& path = boundary.snapshot();
    if (!path.empty()) {
      EXPECT_EQ(path, ddp::snapshot_path(dir, 1, step));
      steps += std::to_string(step) + " ";
    }
    if (slow) now += 1;  // the step "takes" a second on the last rank only
  }
  EXPECT_EQ(steps, "4 8 12 ");
  EXPECT_EQ(due_here_at_3, slow ? 1 : 0) << "only the last rank's own clock was due";
  const std::vector<std::string> all = ddp::all_gather_strings(pg().cpu(), steps);
  for (const std::string& other : all) EXPECT_EQ(other, steps);
  EXPECT_EQ(checkpointer.cost().written, 3);
  EXPECT_EQ(checkpointer.cost().at_epoch_end, 0);
  EXPECT_GE(checkpointer.cost().seconds, checkpointer.cost().max_seconds);
  if (rt().is_main()) {  // only the newest step snapshot is kept
    EXPECT_EQ(ddp::list_snapshots(dir), std::vector<std::string>{ddp::snapshot_path(dir, 1, 12)});
  }
  // An epoch end restarts the timer too; without the agreed "due", nothing is written.
  now += 5;
  checkpointer.save_epoch(1, 13);
  EXPECT_FALSE(checkpointer.time_due());
  EXPECT_EQ(checkpointer.cost().written, 4);
  EXPECT_EQ(checkpointer.cost().at_epoch_end, 1);
  if (slow) now += 3;
  EXPECT_EQ(checkpointer.time_due(), slow);
  EXPECT_EQ(checkpointer.at_boundary(false, {2, 1, 14}, [] { return ddp::RankState{}; }), "");
}

// The agreement is read a boundary late, but a boundary that writes a snapshot agrees at once:
// a loss that was not finite in the step just taken (on the last rank only) fails every rank
// there, before the snapshot. Between snapshots the same loss fails them at the next boundary,
// and end_epoch() agrees at once, before the epoch's snapshot.
TEST(StepBoundary, ANonFiniteLossIsAgreedBeforeAnySnapshot) {
  Net net;
  torch::optim::SGD optimizer(net.parameters(), torch::optim::SGDOptions(0.1));
  ddp::CheckpointerOptions every_4;
  every_4.dir = shared_dir("boundary_nonfinite");
  every_4.every_steps = 4;
  ddp::StepBoundary boundary(pg(), ddp::Checkpointer(pg(), net, optimizer, every_4));
  ddp::DistributedSampler sampler(100, rt().world_size(), rt().rank(), true, 0);
  boundary.start_epoch(1, sampler, 1);
  const bool last = rt().rank() == rt().world_size() - 1;
  const std::string rank = "the loss of rank " + std::to_string(rt().world_size() - 1);
  for (int64_t step = 0; step < 4; ++step) ASSERT_FALSE(boundary.at_step(step, step, {}));
  EXPECT_EQ(message_of([&] { boundary.at_step(4, 4, {}, last ? 4 : -1); }),
            rank + " was not finite (first at step 4)");
  if (rt().is_main()) {
    EXPECT_TRUE(ddp::list_snapshots(every_4.dir).empty()) << "refused first";
  }
  EXPECT_EQ(message_of([&] { boundary.at_step(5, 5, {}, last ? 5 : -1); }), "") << "sent";
  EXPECT_EQ(message_of([&] { boundary.at_step(6, 6, {}, last ? 5 : -1); }),
            rank + " was not finite (first at step 5)");
  EXPECT_EQ(message_of([&] { boundary.end_epoch(last ? 7 : -1); }),
            rank + " was not finite (first at step 7)");
}

TEST(Checkpointer, EpochEndsRotateAndSupersedeTheSnapshotsInsideAnEpoch) {
  const std::string dir = shared_dir("checkpointer_rotate");
  ddp::CheckpointerOptions options;
  options.dir = dir;
  options.keep = 2;
  Net net;
  torch::optim::SGD optimizer(net.parameters(), torch::optim::SGDOptions(0.1));
  ddp::Checkpointer checkpointer(pg(), net, optimizer, options);
  checkpointer.save_step({1, 2, 2}, {});
  for (int64_t epoch = 1; epoch <= 3; ++epoch) checkpointer.save_epoch(epoch, 4 * epoch);
  if (rt().is_main()) {
    EXPECT_EQ(ddp::list_snapshots(dir),
              (std::vector<std::string>{ddp::snapshot_path(dir, 3), ddp::snapshot_path(dir, 2)}));
    EXPECT_FALSE(std::filesystem::exists(dir + "/model_with_epoch1.pt"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/model_with_epoch2.pt"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/model_with_epoch3.pt"));
  }
  // Without a directory nothing is written, and nothing fails.
  ddp::Checkpointer none(pg(), net, optimizer, {});
  EXPECT_EQ(none.at_boundary(true, {1, 1, 1}, [] { return ddp::RankState{}; }), "");
  none.save_epoch(1, 1);
  EXPECT_FALSE(none.resume().resumed());
}

// A loop with a budget of optimizer steps, spent inside epoch 1 (issue 60): its files are named
// by the step, not by an epoch it never finished, and a resume trains the epoch's rest.
TEST(Checkpointer, ARunThatEndsInsideAnEpochNamesItsWeightsByTheStep) {
  const std::string dir = shared_dir("checkpointer_budget");
  ddp::CheckpointerOptions options;
  options.dir = dir;
  torch::manual_seed(1);
  auto net_ptr = std::make_shared<Net>();
  ddp::DistributedDataParallel wrapped(pg(), net_ptr);
  torch::optim::SGD optimizer(net_ptr->parameters(), torch::optim::SGDOptions(0.1));
  at::Generator noise = at::make_generator<at::CPUGeneratorImpl>(100 + rt().rank());
  const int64_t budget = 5, batch = 2;  // 64 samples: at least 8 batches an epoch on each rank
  ddp::DistributedSampler sampler(64, rt().world_size(), rt().rank(), true, 3);
  std::string written;
  {
    ddp::StepBoundary boundary(pg(), ddp::Checkpointer(pg(), *net_ptr, optimizer, options));
    int64_t step = boundary.resume().position.step;
    for (int64_t epoch = 1; epoch <= 2 && written.empty(); ++epoch) {
      const ddp::EpochStart start = boundary.start_epoch(epoch, sampler, batch);
      for (int64_t b = start.first_batch; b < start.batches(sampler, batch); ++b) {
        ASSERT_FALSE(boundary.at_step(b, step, {}));
        if (step == budget) {  // spent: save where the run stands, then end
          written = boundary.checkpointer().save_unfinished_epoch(boundary.position(), {});
          break;
        }
        train_steps(*net_ptr, optimizer, noise, 1);
        ++step;
      }
      if (!written.empty()) break;
      boundary.end_epoch();
      boundary.checkpointer().save_epoch(epoch, step);
    }
  }
  EXPECT_EQ(written, ddp::snapshot_path(dir, 1, budget));
  if (rt().is_main()) {
    EXPECT_EQ(ddp::list_snapshots(dir), std::vector<std::string>{written});
    EXPECT_FALSE(std::filesystem::exists(dir + "/model_with_epoch1.pt"));
    Net saved;
    ddp::load_module(saved, dir + "/model_at_step5.pt");
    EXPECT_TRUE(torch::equal(flat(saved), flat(*net_ptr)));
  }
  ddp::CheckpointerOptions resume = options;
  resume.resume = "latest";
  ddp::Checkpointer resumed(pg(), *net_ptr, optimizer, resume);
  const ddp::TrainingPosition at = resumed.resume().position;
  EXPECT_EQ(at.epoch, 1);
  EXPECT_EQ(at.batch, budget);
  EXPECT_EQ(at.step, budget);
}

TEST(Checkpointer, OptionsOutOfRangeAndUnwritableDirectoriesNameTheField) {
  Net net;
  torch::optim::SGD optimizer(net.parameters(), torch::optim::SGDOptions(0.1));
  auto error = [&](ddp::CheckpointerOptions o) {
    return message_of([&] { ddp::Checkpointer(pg(), net, optimizer, o); });
  };
  ddp::CheckpointerOptions o;
  o.keep = -1;
  EXPECT_EQ(error(o), "CheckpointerOptions::keep must be >= 0 (got -1)");
  o = {};
  o.every_steps = 5;
  EXPECT_EQ(error(o),
            "CheckpointerOptions::every_steps is 5 but dir is empty: there is nowhere to write");
  o = {};
  o.every_seconds = 2.5;
  EXPECT_EQ(
      error(o),
      "CheckpointerOptions::every_seconds is 2.500000 but dir is empty: there is nowhere to write");
  o.every_seconds = -1;
  EXPECT_EQ(error(o), "CheckpointerOptions::every_seconds must be finite and >= 0 (got -1.000000)");
  o.every_seconds = std::nan("");
  EXPECT_EQ(error(o), "CheckpointerOptions::every_seconds must be finite and >= 0 (got nan)");
  o = {};
  o.resume = "latest";
  EXPECT_EQ(error(o),
            "CheckpointerOptions::resume is \"latest\" but dir is empty: there is no directory to "
            "search");
  if (rt().is_main()) {  // only rank 0 checks the directory
    o = {};
    o.dir = std::string(DDP_TEST_DIR) + "/kit/test_hand_written_loop.cpp/checkpoints";
    EXPECT_NE(error(o).find("CheckpointerOptions::dir: " + o.dir +
                            ": cannot create the checkpoint "
                            "directory: Not a directory"),
              std::string::npos)
        << error(o);
  }
}

TEST(Reporter, AResumedRunKeepsTheMetricsOfTheEpochsItsSnapshotFinished) {
  const std::string dir = shared_dir("reporter_metrics");
  ddp::ReporterOptions options;
  options.progress = ddp::ProgressMode::None;
  options.metrics_file = dir + "/metrics.jsonl";
  if (rt().is_main()) {
    // Epoch 3's line torn by a full disk (issue 38): dropped, not continued by the next line.
    std::ofstream(options.metrics_file) << "{\"epoch\": 1}\n{\"epoch\": 2}\n{\"epoch\": 3, \"tr";
  }
  ddp::EpochResult epoch2;
  epoch2.epoch = 2;
  epoch2.train_loss = 0.25;
  epoch2.test_loss = 0.5;
  epoch2.test_metrics = {ddp::Metric{"accuracy", 3, 4}};
  {
    ddp::Reporter reporter(pg(), options);
    ddp::ResumePoint start;
    start.path = "snapshot_epoch1.pt";
    start.position = {2, 0, 10};  // epoch 1 done: its line stays, 2 and the torn 3 go
    reporter.start_run(start);
    reporter.epoch_done(epoch2);
  }
  auto lines = [&] {
    std::ifstream in(options.metrics_file);
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);) all.push_back(line);
    return all;
  };
  if (rt().is_main()) {
    const std::vector<std::string> kept = lines();
    ASSERT_EQ(kept.size(), 2u);
    EXPECT_EQ(kept[0], "{\"epoch\": 1}");
    EXPECT_EQ(
        kept[1].rfind("{\"epoch\":2,\"train_loss\":0.25,\"test_loss\":0.5,\"test_accuracy\":0.75,"
                      "\"samples_per_sec\":0.0,",
                      0),
        0u)
        << kept[1];
  }
  ddp::Reporter fresh(pg(), options);
  fresh.start_run(ddp::ResumePoint{});  // a fresh run starts a new file
  if (rt().is_main()) {
    EXPECT_TRUE(lines().empty());
  }
  // A file that cannot be opened is refused with the reason (issue 38: it had none); rank 0
  // opens it, the other ranks have no file.
  const std::vector<std::pair<std::string, std::string>> unwritable_files{
      {dir + "/no/such/folder/m.jsonl", "No such file or directory"}, {dir, "Is a directory"}};
  for (const auto& [file, reason] : unwritable_files) {
    options.metrics_file = file;
    ddp::Reporter unwritable(pg(), options);
    EXPECT_EQ(message_of([&] { unwritable.start_run(ddp::ResumePoint{}); }),
              rt().is_main() ? file + ": cannot open the metrics file for writing: " + reason : "");
  }
  options.log_interval = -1;
  EXPECT_EQ(message_of([&] { ddp::Reporter(pg(), options); }),
            "ReporterOptions::log_interval must be >= 0 (got -1)");
}

TEST(Reporter, LogLinesShowTheLossAveragedOverTheRanks) {
  ddp::ReporterOptions options;
  options.progress = ddp::ProgressMode::Log;
  options.log_interval = 2;
  ddp::Reporter reporter(pg(), options);
  testing::internal::CaptureStdout();
  reporter.start_epoch(ddp::EpochPlan{3, 0, 4, 10, 8, 1000});
  for (int64_t b = 0; b < 4; ++b) {
    reporter.batch_done(b, torch::tensor(static_cast<double>(rt().rank() + 1 + b)), 8);
  }
  reporter.end_epoch();
  const std::string out = testing::internal::GetCapturedStdout();
  if (!rt().is_main()) {
    EXPECT_EQ(out, "") << "only rank 0 prints";
    return;
  }
  const double mean = (rt().world_size() + 1) / 2.0;  // of the ranks' r + 1
  char expected[256];
  std::snprintf(expected, sizeof expected, "Epoch 3 [0/1000 (0%%)] loss %.6f ETA ", mean);
  EXPECT_EQ(out.rfind(expected, 0), 0u) << out;
  std::snprintf(expected, sizeof expected, "\nEpoch 3 [%d/1000 (20%%)] loss %.6f ETA ",
                2 * 8 * rt().world_size(), mean + 2);
  EXPECT_NE(out.find(expected), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
}

TEST(EpochMeter, RefusesTheSumsOfAnotherTaskAndAddsOverRanks) {
  ddp::EpochMeter meter({"a", "b"}, torch::kCPU);
  EXPECT_EQ(message_of([&] { meter.add(torch::ones({2}), 1); }),
            "EpochMeter::add: the loss must be a scalar (got 2 elements)");
  EXPECT_EQ(message_of([&] { meter.add(torch::tensor(1.0), 1, {torch::tensor(1.0)}); }),
            "EpochMeter::add: 1 metric sum(s) for the 2 metric name(s)");
  EXPECT_NE(message_of([&] {
              meter.restore(torch::zeros({8}, torch::kDouble));
            }).find("has 8 sums, but this one needs 9 (7 and one per metric: 2)"),
            std::string::npos);
  meter.add(torch::tensor(2.0), 3,
            {torch::tensor(1.0), torch::tensor(static_cast<double>(rt().rank()))});
  meter.add(torch::tensor(4.0), 1, {torch::tensor(1.0), torch::tensor(0.0)});
  const ddp::EpochResult r = meter.reduce(pg().cpu(), 1);
  const int w = rt().world_size();
  EXPECT_EQ(r.samples, 4 * w);
  EXPECT_DOUBLE_EQ(r.train_loss, 10.0 / 4);
  EXPECT_EQ(r.train_metrics[0].sum, 2.0 * w);
  EXPECT_EQ(r.train_metrics[1].sum, w * (w - 1) / 2.0);
  EXPECT_EQ(r.train_metrics[1].samples, 4 * w);
}

// A data set whose batch is the indices it was asked for.
struct Indices
    : torch::data::datasets::BatchDataset<Indices, std::vector<size_t>, std::vector<size_t>> {
  std::vector<size_t> get_batch(std::vector<size_t> request) override { return request; }
  std::optional<size_t> size() const override { return 103; }
};

TEST(BatchRangeSampler, ADataLoaderWithWorkersReadsExactlyTheRangeOfTheEpoch) {
  ddp::DistributedSampler sampler(103, rt().world_size(), rt().rank(), /*shuffle=*/true, 4);
  sampler.set_epoch(3);
  const std::vector<int64_t> indices = sampler.indices();
  const int64_t batch = 5, batches = (static_cast<int64_t>(indices.size()) + batch - 1) / batch;
  for (const auto& [first, end] : {std::pair<int64_t, int64_t>{0, batches}, {2, batches}, {1, 3}}) {
    auto loader = torch::data::make_data_loader(
        Indices(), ddp::BatchRangeSampler(sampler, batch, first, end),
        torch::data::DataLoaderOptions().batch_size(batch).workers(2));
    std::vector<int64_t> seen;
    int64_t count = 0;
    for (const std::vector<size_t>& b : *loader) {
      seen.insert(seen.end(), b.begin(), b.end());
      ++count;
    }
    const int64_t n = static_cast<int64_t>(indices.size());
    EXPECT_EQ(count, end - first);
    EXPECT_EQ(seen, std::vector<int64_t>(indices.begin() + std::min(n, first * batch),
                                         indices.begin() + std::min(n, end * batch)))
        << "batches " << first << " to " << end;
  }
  ddp::BatchRangeSampler range(sampler, batch, 0, 2);
  range.reset(103);
  EXPECT_NE(message_of([&] { range.next(4); })
                .find("the data loader asks for batches of 4 but the "
                      "range was cut in batches of 5"),
            std::string::npos);
  EXPECT_THROW(ddp::BatchRangeSampler(sampler, batch, 3, 2), std::invalid_argument);
}

}  // namespace test_hand_written_loop

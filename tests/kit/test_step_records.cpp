// The Reporter's step records (issue 41), for any loop: every log_interval batches rank 0 writes
// the loss averaged over the ranks, what the loop passed (StepScalars: step, learning rate,
// gradient norm where given, phase times as shares) and the throughput, beside the epoch lines;
// a resumed run keeps the records up to its snapshot's step and drops later ones; with a
// TensorBoard folder rank 0 starts an event file there; a record that cannot be written ends
// the job at the epoch's end (write_metrics), not inside the epoch.
#include <ddp/train/reporter.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

ddp::ProcessGroup& pg() { return ddp_test::group(); }

std::string shared_dir(const std::string& name) {
  return ddp::all_gather_strings(pg().cpu(),
                                 pg().is_main() ? ddp_test::make_temp_dir(name) : "")[0];
}

std::vector<nlohmann::json> read_lines(const std::string& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(StepRecords, EveryLogIntervalBatchesWithWhatTheLoopPassed) {
  const std::string dir = shared_dir("step_records");
  ddp::ReporterOptions options;
  options.progress = ddp::ProgressMode::None;
  options.log_interval = 2;
  options.metrics_file = dir + "/metrics.jsonl";
  options.tensorboard_dir = dir + "/events";
  ddp::Reporter reporter(pg(), options);
  reporter.start_run(ddp::ResumePoint{});
  reporter.start_epoch({1, 0, 4, 4, 8, 64});
  for (int64_t b = 0; b < 4; ++b) {
    ddp::StepScalars scalars;
    scalars.step = 10 + b;
    scalars.lr = 0.125;
    if (b == 0) scalars.grad_norm = 1.5;
    scalars.phases = ddp::PhaseTimes{0.001, 0.002, 0, 0.0005};
    // Rank r's loss is r + 1: the record's is their mean.
    reporter.batch_done(b, torch::tensor(static_cast<double>(pg().rank() + 1)), 8, scalars);
  }
  reporter.end_epoch();
  ddp::EpochResult epoch;
  epoch.epoch = 1;
  epoch.train_loss = 0.5;
  reporter.epoch_done(epoch);
  if (!pg().is_main()) return;
  const std::vector<nlohmann::json> lines = read_lines(options.metrics_file);
  ASSERT_EQ(lines.size(), 3u);  // batches 0 and 2, then the epoch line
  const double mean_loss = (pg().size() + 1) / 2.0;
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json& r = lines[static_cast<size_t>(i)];
    EXPECT_EQ(r.at("kind"), "step");
    EXPECT_EQ(r.at("epoch"), 1);
    EXPECT_EQ(r.at("batch"), 2 * i);
    EXPECT_EQ(r.at("step"), 10 + 2 * i);
    EXPECT_DOUBLE_EQ(r.at("loss").get<double>(), mean_loss);
    EXPECT_DOUBLE_EQ(r.at("lr").get<double>(), 0.125);
    EXPECT_EQ(r.contains("grad_norm"), i == 0) << r.dump();  // only where the loop gave one
    EXPECT_GT(r.at("samples_per_sec").get<double>(), 0.0);
    for (const char* share : {"data_share", "forward_backward_share", "optimizer_share"}) {
      EXPECT_GT(r.at(share).get<double>(), 0.0) << share;
    }
    EXPECT_EQ(r.at("sync_share").get<double>(), 0.0);
  }
  EXPECT_DOUBLE_EQ(lines[0].at("grad_norm").get<double>(), 1.5);
  EXPECT_FALSE(lines[2].contains("kind"));  // the epoch line as it was
  EXPECT_EQ(lines[2].at("epoch"), 1);
  // The event file, started with the run.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(options.tensorboard_dir)) {
    EXPECT_EQ(entry.path().filename().string().rfind("events.out.tfevents.", 0), 0u);
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(StepRecords, AResumedRunKeepsTheRecordsUpToItsSnapshotsStep) {
  const std::string dir = shared_dir("step_records_resume");
  ddp::ReporterOptions options;
  options.progress = ddp::ProgressMode::None;
  options.log_interval = 1;
  options.metrics_file = dir + "/metrics.jsonl";
  if (pg().is_main()) {
    // Epoch 1 (steps 1-4) finished, then epoch 2 up to step 7 by a run that crashed after the
    // snapshot of step 5 (epoch 2, batch 1).
    std::ofstream(options.metrics_file)
        << "{\"kind\":\"step\",\"epoch\":1,\"batch\":0,\"step\":1,\"loss\":1}\n"
           "{\"kind\":\"step\",\"epoch\":1,\"batch\":2,\"step\":3,\"loss\":1}\n"
           "{\"epoch\":1,\"train_loss\":1}\n"
           "{\"kind\":\"step\",\"epoch\":2,\"batch\":0,\"step\":5,\"loss\":1}\n"
           "{\"kind\":\"step\",\"epoch\":2,\"batch\":1,\"step\":6,\"loss\":1}\n"
           "{\"kind\":\"step\",\"epoch\":2,\"batch\":2,\"step\":7,\"loss\":1}\n";
  }
  ddp::Reporter reporter(pg(), options);
  ddp::ResumePoint start;
  start.path = "snapshot_epoch2_batch1.pt";
  start.position = {2, 1, 5};
  reporter.start_run(start);
  // Without StepScalars::step, the Reporter counts batches from the snapshot's step.
  reporter.start_epoch({2, 1, 3, 4, 8, 64});
  reporter.batch_done(1, torch::tensor(2.0), 8);
  if (!pg().is_main()) return;
  std::vector<int64_t> steps;
  int epoch_lines = 0;
  for (const nlohmann::json& r : read_lines(options.metrics_file)) {
    if (r.contains("kind")) {
      steps.push_back(r.at("step").get<int64_t>());
    } else {
      ++epoch_lines;
    }
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 3, 5, 6}));  // 6 and 7 dropped, 6 written again
  EXPECT_EQ(epoch_lines, 1);
}

TEST(StepRecords, AFailedWriteEndsTheJobAtTheEpochsEndNotInsideIt) {
  ddp::ReporterOptions options;
  options.progress = ddp::ProgressMode::None;
  options.log_interval = 1;
  options.metrics_file = "/dev/full";  // every write fails with ENOSPC, as on a full disk
  ddp::Reporter reporter(pg(), options);
  reporter.start_run(ddp::ResumePoint{});
  reporter.start_epoch({1, 0, 2, 2, 8, 64});
  EXPECT_NO_THROW(reporter.batch_done(0, torch::tensor(1.0), 8));  // the loop goes on ...
  EXPECT_NO_THROW(reporter.batch_done(1, torch::tensor(1.0), 8));
  reporter.end_epoch();
  ddp::EpochResult epoch;
  epoch.epoch = 1;
  if (!pg().is_main()) return;
  try {
    reporter.write_metrics(epoch);  // ... to the epoch's end, after its checkpoint
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "/dev/full: cannot write the metrics file: No space left on device");
  }
}

}  // namespace

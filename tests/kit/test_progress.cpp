// Progress display (progress.h): the pure formatting, parsing and ETA; the report formats
// (reporter.h): the generic lines, the classification preset's seed lines, the end-of-run table.
#include <ddp/train/classification.h>
#include <ddp/train/progress.h>
#include <ddp/train/reporter.h>

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

TEST(Progress, ParsesEveryModeAndNamesABadOne) {
  EXPECT_EQ(ddp::parse_progress_mode("auto"), ddp::ProgressMode::Auto);
  EXPECT_EQ(ddp::parse_progress_mode("bar"), ddp::ProgressMode::Bar);
  EXPECT_EQ(ddp::parse_progress_mode("log"), ddp::ProgressMode::Log);
  EXPECT_EQ(ddp::parse_progress_mode("none"), ddp::ProgressMode::None);
  try {
    ddp::parse_progress_mode("fancy");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'fancy'"), std::string::npos) << e.what();
  }
}

TEST(Progress, ExplicitModesAreNotResolved) {
  EXPECT_EQ(ddp::resolve_progress_mode(ddp::ProgressMode::Bar), ddp::ProgressMode::Bar);
  EXPECT_EQ(ddp::resolve_progress_mode(ddp::ProgressMode::None), ddp::ProgressMode::None);
  EXPECT_NE(ddp::resolve_progress_mode(ddp::ProgressMode::Auto), ddp::ProgressMode::Auto);
}

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(ddp::format_duration(0), "0:00");
  EXPECT_EQ(ddp::format_duration(7.4), "0:07");
  EXPECT_EQ(ddp::format_duration(754), "12:34");
  EXPECT_EQ(ddp::format_duration(3723), "1:02:03");
  EXPECT_EQ(ddp::format_duration(-1), "?");
}

TEST(Progress, EtaIsTheMeanBatchTimeTimesWhatIsLeft) {
  EXPECT_DOUBLE_EQ(ddp::eta_seconds(10.0, 25, 100), 30.0);
  EXPECT_DOUBLE_EQ(ddp::eta_seconds(10.0, 100, 100), 0.0);
  EXPECT_LT(ddp::eta_seconds(10.0, 0, 100), 0.0);  // nothing done: unknown
}

TEST(Progress, BarLineHoldsEveryFieldAndFitsTheWidth) {
  const std::string line = ddp::format_progress_bar(1, 120, 469, 1169.4, 0.52341, 12.0, 100);
  EXPECT_EQ(line.rfind("Epoch 1 [120/469  26%] |", 0), 0u) << line;
  EXPECT_NE(line.find("1169 samples/s"), std::string::npos) << line;
  EXPECT_NE(line.find("loss 0.5234"), std::string::npos) << line;
  EXPECT_NE(line.find("0:12<0:35"), std::string::npos) << line;  // 12 s * 349/120 = 34.9 s left
  EXPECT_LE(line.size(), 100u);
  const std::string narrow = ddp::format_progress_bar(1, 120, 469, 1169.4, -1, 12.0, 50);
  EXPECT_LE(narrow.size(), 50u);
  EXPECT_EQ(narrow.find('|'), std::string::npos) << "no room for a bar: " << narrow;
  EXPECT_NE(ddp::format_progress_bar(1, 1, 10, 0, -1, 0, 100).find("loss -"), std::string::npos);
}

// The log line's counter: PyTorch's in a whole epoch (the samples before the batch, b of the
// batches per epoch); after a resume with another batch size (issue 60: "[896/768 (78%)]") the
// samples before the re-sharded rest, then the rest's batches, never past the epoch.
TEST(Progress, CounterCountsTheEpochsSamplesAfterABatchSizeChange) {
  const ddp::EpochPlan whole{1, 0, 469, 469, 64, 60000};
  EXPECT_EQ(whole.samples_before(120, 2), 120 * 64 * 2);
  EXPECT_DOUBLE_EQ(whole.percent_before(120), 100.0 * 120 / 469);
  // 768 samples on 2 ranks: stopped after 12 batches of 16 (384 samples), resumed in batches of
  // 32: the rest is 192 per rank, 6 batches, counted on from batch 12 (sampler offset 12, start
  // 384).
  const ddp::EpochPlan resumed{1, 12, 18, 18, 32, 768, 12, 384};
  EXPECT_EQ(resumed.samples_before(12, 2), 384);
  EXPECT_EQ(resumed.samples_before(14, 2), 512);
  EXPECT_EQ(resumed.samples_before(17, 2), 704);
  EXPECT_DOUBLE_EQ(resumed.percent_before(12), 50.0);
  EXPECT_DOUBLE_EQ(resumed.percent_before(15), 75.0);
  ddp::ProgressLine line;
  line.epoch = 1;
  line.seen = resumed.samples_before(14, 2);
  line.dataset_size = resumed.dataset_size;
  line.percent = resumed.percent_before(14);
  line.loss = 0.5;
  EXPECT_EQ(ddp::ReportFormat().log_line(line).rfind("Epoch 1 [512/768 (67%)] loss 0.500000", 0),
            0u)
      << ddp::ReportFormat().log_line(line);
}

ddp::EpochResult epoch_result(int64_t epoch, int64_t correct) {
  ddp::EpochResult r;
  r.epoch = epoch;
  r.train_loss = 0.52667;
  r.samples = 60000;
  r.test_loss = 0.33434;
  r.test_metrics = {ddp::Metric{"accuracy", static_cast<double>(correct), 10000}};
  r.seconds = 50.21;
  r.samples_per_sec = 1194.9;
  r.phases = ddp::PhaseTimes{0.05, 45.0, 2.41, 2.2};
  return r;
}

TEST(ReportFormat, ClassificationSummaryTableShowsTheAccuracyAsAPercentage) {
  const std::string table =
      ddp::ClassificationFormat().summary_table({epoch_result(1, 8743), epoch_result(2, 9016)});
  EXPECT_EQ(table,
            "epoch  train loss  test loss  test acc  time (s)  samples/s    sync\n"
            "    1      0.5267     0.3343    87.43%     50.21       1195    4.8%\n"
            "    2      0.5267     0.3343    90.16%     50.21       1195    4.8%\n");
}

TEST(ReportFormat, GenericSummaryTableHasAColumnPerMetric) {
  ddp::EpochResult r = epoch_result(1, 8743);
  r.train_metrics = {ddp::Metric{"abs_error", 1200.0, 60000}};
  const std::string table = ddp::ReportFormat().summary_table({r});
  EXPECT_EQ(
      table,
      "epoch  train loss  train_abs_error  test loss  test_accuracy  time (s)  samples/s    sync\n"
      "    1      0.5267             0.02     0.3343         0.8743     50.21       1195    "
      "4.8%\n");
  EXPECT_EQ(ddp::ReportFormat().summary_table({}), "");
}

TEST(ReportFormat, SnapshotLineSaysHowManyAndTheirShareOfTheTraining) {
  ddp::SnapshotCost cost;
  cost.written = 12;
  cost.at_epoch_end = 2;
  cost.seconds = 0.84;
  cost.max_seconds = 0.21;
  EXPECT_EQ(
      ddp::ReportFormat::snapshot_line(cost, 27.1),
      "Snapshots: 12 written (10 inside epochs, 2 at epoch ends), 0.84 s in all, mean 70.0 ms, "
      "max 210.0 ms: 3.1% of 27.10 s of training");
  EXPECT_EQ(
      ddp::ReportFormat::snapshot_line(cost, 0),
      "Snapshots: 12 written (10 inside epochs, 2 at epoch ends), 0.84 s in all, mean 70.0 ms, "
      "max 210.0 ms");
}

TEST(ReportFormat, ClassificationLinesAreTheSeedScripts) {
  const ddp::ClassificationFormat format;
  ddp::ProgressLine line;
  line.epoch = 1;
  line.seen = 640;
  line.dataset_size = 60000;
  line.percent = 1.07;
  line.loss = 1.3977694;
  line.eta_seconds = 1.2;
  EXPECT_EQ(format.log_line(line), "Train Epoch: 1 [640/60000 (1%)]\tLoss: 1.397769\tETA 0:01");
  EXPECT_EQ(format.epoch_lines(epoch_result(1, 8743), "2 rank(s)"),
            "\nTest set: Average loss: 0.3343, Accuracy: 8743/10000 (87%)\n\n"
            "Epoch 1: 50.21 s, 1195 samples/s over 2 rank(s) | data 0.1%, forward+backward 89.6%, "
            "gradient sync 4.8%, optimizer 4.4%\n\n");
}

TEST(ReportFormat, EpochLineShowsTheGpuMemoryPeakOnlyOnAGpu) {
  ddp::EpochResult r = epoch_result(1, 8743);
  const std::string timed =
      "Epoch 1: 50.21 s, 1195 samples/s over 1 rank(s) | data 0.1%, "
      "forward+backward 89.6%, gradient sync 4.8%, optimizer 4.4%";
  EXPECT_EQ(ddp::ReportFormat::timing_line(r, "1 rank(s)"), timed);  // -1: the CPU
  r.gpu_memory_peak_mb = 1536.4;
  EXPECT_EQ(ddp::ReportFormat::timing_line(r, "1 rank(s)"), timed + " | GPU memory peak 1536 MiB");
  r.phases = ddp::PhaseTimes{};  // untimed
  EXPECT_EQ(ddp::ReportFormat::timing_line(r, "1 rank(s)"),
            "Epoch 1: 50.21 s, 1195 samples/s over 1 rank(s) | GPU memory peak 1536 MiB");
}

TEST(ReportFormat, GenericLinesNameEveryMetricAndNoAccuracy) {
  const ddp::ReportFormat format;
  ddp::ProgressLine line;
  line.epoch = 2;
  line.seen = 1280;
  line.dataset_size = 96;
  line.percent = 50;
  line.loss = 0.25;
  EXPECT_EQ(format.log_line(line), "Epoch 2 [1280/96 (50%)] loss 0.250000 ETA ?");
  ddp::EpochResult r = epoch_result(2, 8743);
  r.train_metrics = {ddp::Metric{"abs_error", 1200.0, 60000}};
  EXPECT_EQ(format.epoch_lines(r, "4 rank(s)"),
            "\nTrain set: loss 0.5267, abs_error 0.02\n"
            "Test set: loss 0.3343, accuracy 0.8743\n\n"
            "Epoch 2: 50.21 s, 1195 samples/s over 4 rank(s) | data 0.1%, forward+backward "
            "89.6%, gradient sync 4.8%, optimizer 4.4%\n\n");
}

// Progress display (progress.h): the pure formatting, parsing and ETA; the end-of-run table.
#include <ddp/train/progress.h>
#include <ddp/train/trainer.h>

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

TEST(Progress, SummaryTableHasARowPerEpoch) {
  ddp::EpochResult first;
  first.epoch = 1;
  first.train_loss = 0.52667;
  first.test_loss = 0.33434;
  first.test_accuracy = 0.8743;
  first.seconds = 50.21;
  first.samples_per_sec = 1194.9;
  first.phases.sync = 2.41;
  ddp::EpochResult second = first;
  second.epoch = 2;
  second.test_accuracy = 0.9016;
  const std::string table = ddp::summary_table({first, second});
  EXPECT_EQ(table,
            "epoch  train loss  test loss  test acc  time (s)  samples/s    sync\n"
            "    1      0.5267     0.3343    87.43%     50.21       1195    4.8%\n"
            "    2      0.5267     0.3343    90.16%     50.21       1195    4.8%\n");
}

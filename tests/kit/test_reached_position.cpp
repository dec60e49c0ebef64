// How far a run got (src/train/reached_position.h): what the Checkpointer records at every step
// and what a run resumed after a crash says it lost. The end-to-end line is checked by the
// node-loss tests (tests/cluster: slurm_node_loss, netns_lost_host).
#include "train/reached_position.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace {

using ddp::detail::Reached;

TEST(ReachedPosition, TheLastWriteIsWhatIsRead) {
  const std::string dir = ddp_test::make_temp_dir("reached");
  EXPECT_FALSE(ddp::detail::read_reached(dir).has_value());
  {
    ddp::detail::ReachedRecord record(dir);
    record.write({2, 123456, 1234567, 4096});
    record.write({3, 7, 9, 64});  // shorter: no tail of the longer line may stay
  }
  const auto got = ddp::detail::read_reached(dir);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->epoch, 3);
  EXPECT_EQ(got->batch, 7);
  EXPECT_EQ(got->step, 9);
  EXPECT_EQ(got->samples_per_step, 64);
}

TEST(ReachedPosition, AGarbledFileIsNoRecord) {
  const std::string dir = ddp_test::make_temp_dir("reached_garbled");
  std::ofstream(dir + "/" + ddp::detail::kReachedFileName) << "epoch x";
  EXPECT_FALSE(ddp::detail::read_reached(dir).has_value());
}

TEST(ReachedPosition, TheLostWorkIsTheStepsAfterTheSnapshot) {
  EXPECT_EQ(ddp::detail::lost_work_line({1, 57, 57, 64}, 48),
            "The previous run had reached step 57 (epoch 1, batch 57): 9 step(s) (576 samples) "
            "after the snapshot are lost: trained again");
  EXPECT_EQ(ddp::detail::lost_work_line({1, 57, 57, 0}, 48),
            "The previous run had reached step 57 (epoch 1, batch 57): 9 step(s) after the "
            "snapshot are lost: trained again");
  EXPECT_EQ(ddp::detail::lost_work_line({1, 48, 48, 64}, 48), "");  // stopped at the snapshot
}

TEST(ReachedPosition, AnUncreatableRecordIsNamed) {
  try {
    ddp::detail::ReachedRecord record("/nonexistent/dir");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/.ddp.reached: cannot create it"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace

// The TensorBoard event file's framing (src/train/tensorboard_writer.h): CRC-32C, TensorFlow's
// mask, and a whole record, against the values TensorBoard's own record writer gives
// (tensorboard.summary.writer.record_writer, tensorboard 2.21); and the writer's errors. That
// TensorBoard reads the files ddp writes is tested end to end by tensorboard_metrics_check.py.
#include "train/tensorboard_writer.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace {

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

TEST(TensorBoardWriter, Crc32cAndItsMaskAreTensorFlows) {
  const std::string check = "123456789";
  EXPECT_EQ(ddp::detail::crc32c(check.data(), check.size()), 0xE3069283u);  // CRC-32C's check value
  // masked_crc32c(b"123456789") in TensorBoard's record writer.
  EXPECT_EQ(ddp::detail::masked_crc32c(check.data(), check.size()), 0xc78ab0e5u);
}

TEST(TensorBoardWriter, FramesARecordAsTensorBoardDoes) {
  // Event{wall_time: 1.5, file_version: "brain.Event:2"}, serialized, and its record as
  // TensorBoard's writer frames it: length, masked CRC of the length, payload, masked CRC.
  const std::string payload = from_hex("09000000000000f83f1a0d627261696e2e4576656e743a32");
  const std::string record = from_hex(
      "1800000000000000a37f4b22"
      "09000000000000f83f1a0d627261696e2e4576656e743a32"
      "2a28646c");
  EXPECT_EQ(ddp::detail::frame_record(payload), record);
}

TEST(TensorBoardWriter, MakesItsFolderAndStartsTheFileWithTheVersionRecord) {
  const std::string dir = ddp_test::make_temp_dir("tensorboard_writer") + "/runs/a";
  std::string path;
  {
    ddp::detail::TensorBoardWriter writer(dir);
    path = writer.path();
    writer.scalars(3, {{"step/loss", 0.25}});
  }
  EXPECT_EQ(std::filesystem::path(path).parent_path(), std::filesystem::path(dir));
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 16u);
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(bytes.find("step/loss"), std::string::npos);
  // A second writer of the same second gets a file of its own.
  ddp::detail::TensorBoardWriter again(dir);
  EXPECT_NE(again.path(), path);
}

TEST(TensorBoardWriter, AFolderThatCannotBeMadeIsAnErrorNamingIt) {
  const std::string file = ddp_test::make_temp_dir("tensorboard_writer_error") + "/a_file";
  std::ofstream(file) << "x";
  try {
    ddp::detail::TensorBoardWriter writer(file + "/runs");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file + "/runs: cannot create the TensorBoard folder"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace

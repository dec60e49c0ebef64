#pragma once
// A TensorBoard event file, written by rank 0's Reporter (ReporterOptions::tensorboard_dir):
// scalars by step, a run's hyperparameters (the hparams plugin), and the restart mark of a
// resumed run. Internal to ddp_train; no installed header includes it, and the protobuf code
// it writes with stays in its .cpp.
//
// The file is `<dir>/events.out.tfevents.<unix time>.<host>` (".1", ".2", ... appended when a
// run of the same second left one), a sequence of records, each
//   uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
//   payload (an Event protobuf), uint32 masked CRC-32C of the payload,
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8: TensorFlow's TFRecord framing.
// The first record is the Event with file_version "brain.Event:2". Every record is flushed to
// the file as it is written (write(2), no buffer of ours), so a killed job leaves a file that
// TensorBoard reads up to its last whole record.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// Visibility: this file's code is compiled with hidden symbols (framework/CMakeLists.txt,
// ddp_tensorboard), so that the protobuf code it instantiates stays inside libddp_train. What is
// declared here is exported as the library's other internals are (its test calls them).
#define DDP_TENSORBOARD_VISIBLE [[gnu::visibility("default")]]

namespace ddp::detail {

// CRC-32C (Castagnoli) of `size` bytes, and TensorFlow's mask of a CRC.
DDP_TENSORBOARD_VISIBLE uint32_t crc32c(const void* data, size_t size);
DDP_TENSORBOARD_VISIBLE uint32_t masked_crc32c(const void* data, size_t size);
// One record around `payload`: the framing above.
DDP_TENSORBOARD_VISIBLE std::string frame_record(const std::string& payload);

class DDP_TENSORBOARD_VISIBLE TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) when missing, and a new event file in it with its first
  // record. Throws std::runtime_error naming the folder or file and the reason (strerror).
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` with a scalar (float32, as TensorBoard keeps them) per (tag, value).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // The mark of a run resumed before `step`: TensorBoard then drops the events of steps >=
  // `step` read so far (written after the snapshot by the run that stopped).
  void restart(int64_t step);
  // The run's hyperparameters for the hparams plugin, as (name, value) texts: a text that is
  // wholly a finite number ("0.01", "-3", "1e-4") is written as a number, "true" and "false" as
  // booleans, anything else as a string.
  void hparams(const std::vector<std::pair<std::string, std::string>>& values);

  const std::string& path() const { return path_; }

 private:
  // Frames and writes one serialized Event; throws naming the file on a failed write.
  void write(const std::string& event);

  std::string path_;
  int fd_ = -1;
};

}  // namespace ddp::detail

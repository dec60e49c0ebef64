#pragma once
// How far a run got, kept beside its snapshots as <dir>/.ddp.reached by the process that writes
// the directory (rank 0's Checkpointer), updated at every step. A run that dies without a
// snapshot of the moment (a killed rank, a lost host) leaves it behind, so that the run resumed
// from the newest snapshot can say what the loss cost: the steps and samples trained after that
// snapshot, which are trained again.
//
// One fixed-width line, "epoch E batch B step S samples-per-step N", rewritten in place with a
// single pwrite (no fsync: it only has to survive the process, not the machine), so that a reader
// never sees a shorter line with the tail of a longer one.

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::detail {

inline constexpr const char* kReachedFileName = ".ddp.reached";

struct Reached {
  int64_t epoch = 0;             // the epoch in progress, 1-based
  int64_t batch = 0;             // its batches trained
  int64_t step = 0;              // optimizer steps taken in all
  int64_t samples_per_step = 0;  // over all ranks (0: not known)
};

// The record of one directory, open for writing while the Checkpointer lives.
class ReachedRecord {
 public:
  // Throws std::runtime_error naming the file when it cannot be created.
  explicit ReachedRecord(const std::string& dir);
  ~ReachedRecord();
  ReachedRecord(const ReachedRecord&) = delete;
  ReachedRecord& operator=(const ReachedRecord&) = delete;

  // Best effort: a failed write (a full disk) is not worth stopping the training for.
  void write(const Reached& reached);

 private:
  int fd_ = -1;
};

// The record left in `dir`, if any and readable.
std::optional<Reached> read_reached(const std::string& dir);

// What the resumed run lost, for its log: "The previous run had reached step 57 (epoch 1, batch
// 57): 9 step(s) (576 samples) after the snapshot are lost: trained again", or "" when none was
// (the record is not past `snapshot_step`).
std::string lost_work_line(const Reached& reached, int64_t snapshot_step);

}  // namespace ddp::detail

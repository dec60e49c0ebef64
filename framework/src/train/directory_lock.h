#pragma once
// One job per checkpoint directory: flock(2) on <dir>/.ddp.lock, taken by rank 0's Checkpointer
// (the other ranks never touch it, so the ranks of one job never refuse each other) and held while
// it uses the directory. The file names its holder in one line, so that a second job is refused
// naming the first.
//
// Why flock: the kernel drops it when the holder ends, however it ends, so a lock file whose flock
// is free was left by a job that is gone, and is taken over. A clean release removes the file while
// still holding the flock (a taker that opened the old file sees it is no longer the file at the
// path and opens the new one). Within a process the locks of one directory are counted: flock
// would refuse a second open of the same file even in the same process.
//
// Where flock fails for want of support (ENOLCK, EOPNOTSUPP, ENOSYS, EINVAL), take() warns and goes
// on without a lock; docs/reliability.md says what flock does not cover (NFS, Lustre).

#include <sys/types.h>

#include <ctime>
#include <memory>
#include <string>
#include <utility>

namespace ddp::detail {

// The lock file's name inside the directory.
inline constexpr const char* kLockFileName = ".ddp.lock";

// What the lock file says: "host n1, pid 1234, since 2026-11-24 03:20:01 UTC, Slurm job 77"
// (the job only when `slurm_job` is not empty).
std::string lock_holder_line(const std::string& host, long pid, std::time_t since,
                             const std::string& slurm_job);

// Whether flock's errno means the file system cannot lock (warn and go on), not a failure.
bool flock_unsupported(int error);

class DirectoryLock;

struct DirectoryLockResult {
  // Null where the file system cannot lock (then `unsupported` says why).
  std::unique_ptr<DirectoryLock> lock;
  // Not empty: a lock file of a job that is gone was taken over; its holder line.
  std::string previous_holder;
  // Not empty: the warning that no lock could be taken (flock's reason), the job goes on.
  std::string unsupported;
};

// A held lock: destroying the last one of the process removes the lock file and drops the flock.
class DirectoryLock {
 public:
  // Takes the lock of the existing directory `dir` for this process. Throws std::runtime_error
  // "<dir> is in use by another job (<holder line> holds <dir>/.ddp.lock): ..." when another
  // process holds it, and naming the lock file and the system's reason when it cannot be
  // opened, read or written.
  static DirectoryLockResult take(const std::string& dir);

  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::string& path() const { return path_; }  // <dir>/.ddp.lock

 private:
  explicit DirectoryLock(std::string path) : path_(std::move(path)) {}
  std::string path_;
  std::pair<dev_t, ino_t> key_{};  // the directory's device and inode
};

}  // namespace ddp::detail

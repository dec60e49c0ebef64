#include "train/directory_lock.h"

#include "util/file_error.h"
#include "util/host_name.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

namespace ddp::detail {

namespace {

// The lock file, open; closing it drops the flock.
struct LockFile {
  int fd;
  std::string path;
  int users = 0;  // DirectoryLock handles of this process
  LockFile(int fd, std::string path) : fd(fd), path(std::move(path)) {}
  ~LockFile() {
    if (fd >= 0) ::close(fd);
  }
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;
};

// This process's held locks, by the directory's device and inode (one directory, however named).
// Every change happens under the mutex, so a release (remove, close) never overlaps a take of the
// same file.
std::mutex registry_mutex;
std::map<std::pair<dev_t, ino_t>, std::unique_ptr<LockFile>>& registry() {
  static std::map<std::pair<dev_t, ino_t>, std::unique_ptr<LockFile>> held;
  return held;
}

// The holder line a lock file holds: its first line, trimmed and bounded (the file may be
// anything: a person's, a truncated write).
std::string read_holder(int fd) {
  char buffer[512];
  const ssize_t got = ::pread(fd, buffer, sizeof buffer, 0);
  if (got <= 0) return "";
  std::string text(buffer, static_cast<size_t>(got));
  text = text.substr(0, text.find('\n'));
  const auto end = text.find_last_not_of(" \t\r");
  return end == std::string::npos ? "" : text.substr(0, end + 1);
}

}  // namespace

std::string lock_holder_line(const std::string& host, long pid, std::time_t since,
                             const std::string& slurm_job) {
  std::tm utc{};
  ::gmtime_r(&since, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  std::string line = "host " + host + ", pid " + std::to_string(pid) + ", since " + when;
  if (!slurm_job.empty()) line += ", Slurm job " + slurm_job;
  return line;
}

bool flock_unsupported(int error) {
  return error == ENOLCK || error == EOPNOTSUPP || error == ENOTSUP || error == ENOSYS ||
         error == EINVAL;
}

DirectoryLockResult DirectoryLock::take(const std::string& dir) {
  const std::string path = dir + "/" + kLockFileName;
  struct stat dir_info;
  if (::stat(dir.c_str(), &dir_info) != 0) throw_file_error(dir, "cannot use the directory", errno);
  const std::pair<dev_t, ino_t> key{dir_info.st_dev, dir_info.st_ino};
  std::lock_guard<std::mutex> guard(registry_mutex);
  DirectoryLockResult result;
  auto& held = registry();
  if (auto it = held.find(key); it != held.end()) {
    ++it->second->users;
    result.lock.reset(new DirectoryLock(it->second->path));
    result.lock->key_ = key;
    return result;
  }
  // A holder that releases removes the file: then the file this open found is no longer the one
  // at the path, and the next try opens the new one. Two tries suffice unless other jobs keep
  // taking and releasing; more are harmless.
  for (int attempt = 0;; ++attempt) {
    auto file = std::make_unique<LockFile>(
        ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644), path);
    if (file->fd < 0)
      throw_file_error(path, "cannot open the checkpoint directory's lock file", errno);
    struct stat info;
    if (::fstat(file->fd, &info) != 0) throw_file_error(path, "cannot stat the lock file", errno);
    if (!S_ISREG(info.st_mode)) {
      throw std::runtime_error(path +
                               ": the checkpoint directory's lock file is not a regular file");
    }
    int rc;
    do {
      rc = ::flock(file->fd, LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int error = errno;
      if (flock_unsupported(error)) {
        result.unsupported = dir + ": cannot lock " + path + " (" + std::strerror(error) +
                             "): the file system does not support flock, so nothing stops "
                             "another job from using this checkpoint directory at the same time";
        return result;
      }
      if (error != EWOULDBLOCK)
        throw_file_error(path, "cannot lock the checkpoint directory's lock file", error);
      // The holder writes its line right after locking: give it a moment.
      std::string holder = read_holder(file->fd);
      for (int wait = 0; holder.empty() && wait < 5; ++wait) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        holder = read_holder(file->fd);
      }
      if (holder.empty()) holder = "a process that has not written its name";
      throw std::runtime_error(dir + " is in use by another job (" + holder + " holds " + path +
                               "): give each job a checkpoint directory of its own, or wait "
                               "until that job ends");
    }
    struct stat now;
    if (::stat(path.c_str(), &now) != 0 || now.st_dev != info.st_dev || now.st_ino != info.st_ino) {
      if (attempt < 100) continue;
      throw std::runtime_error(path +
                               ": the lock file keeps being replaced while this job takes it");
    }
    result.previous_holder = read_holder(file->fd);
    const char* job = std::getenv("SLURM_JOB_ID");
    const std::string line = lock_holder_line(detail::host_name(), static_cast<long>(::getpid()),
                                              std::time(nullptr), job ? job : "") +
                             "\n";
    if (::ftruncate(file->fd, 0) != 0) throw_file_error(path, "cannot write the lock file", errno);
    const ssize_t wrote = ::pwrite(file->fd, line.data(), line.size(), 0);
    if (wrote != static_cast<ssize_t>(line.size())) {
      throw_file_error(path, "cannot write the lock file", wrote < 0 ? errno : ENOSPC);
    }
    file->users = 1;
    held.emplace(key, std::move(file));
    result.lock.reset(new DirectoryLock(path));
    result.lock->key_ = key;
    return result;
  }
}

DirectoryLock::~DirectoryLock() {
  std::lock_guard<std::mutex> guard(registry_mutex);
  auto& held = registry();
  const auto it = held.find(key_);
  if (it == held.end() || --it->second->users > 0) return;
  // Removed while the flock is held, so no other job can have taken this file meanwhile.
  ::unlink(it->second->path.c_str());
  held.erase(it);  // closes: drops the flock
}

}  // namespace ddp::detail

#include "train/reached_position.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace ddp::detail {

namespace {

constexpr size_t kLineWidth = 127;  // plus the newline

std::string path_in(const std::string& dir) { return dir + "/" + kReachedFileName; }

}  // namespace

ReachedRecord::ReachedRecord(const std::string& dir) {
  const std::string path = path_in(dir);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error(path + ": cannot create it: " + std::strerror(errno));
  }
}

ReachedRecord::~ReachedRecord() {
  if (fd_ >= 0) ::close(fd_);
}

void ReachedRecord::write(const Reached& r) {
  char line[kLineWidth + 2];
  const int n = std::snprintf(line, sizeof line,
                              "epoch %" PRId64 " batch %" PRId64 " step %" PRId64
                              " samples-per-step %" PRId64,
                              r.epoch, r.batch, r.step, r.samples_per_step);
  if (n < 0 || static_cast<size_t>(n) > kLineWidth) return;
  std::memset(line + n, ' ', kLineWidth - static_cast<size_t>(n));
  line[kLineWidth] = '\n';
  [[maybe_unused]] const ssize_t written = ::pwrite(fd_, line, kLineWidth + 1, 0);
}

std::optional<Reached> read_reached(const std::string& dir) {
  std::FILE* file = std::fopen(path_in(dir).c_str(), "r");
  if (file == nullptr) return std::nullopt;
  Reached r;
  const int got = std::fscanf(
      file, "epoch %" SCNd64 " batch %" SCNd64 " step %" SCNd64 " samples-per-step %" SCNd64,
      &r.epoch, &r.batch, &r.step, &r.samples_per_step);
  std::fclose(file);
  if (got != 4) return std::nullopt;
  return r;
}

std::string lost_work_line(const Reached& r, int64_t snapshot_step) {
  if (r.step <= snapshot_step) return "";
  const int64_t steps = r.step - snapshot_step;
  std::string line = "The previous run had reached step " + std::to_string(r.step) + " (epoch " +
                     std::to_string(r.epoch) + ", batch " + std::to_string(r.batch) +
                     "): " + std::to_string(steps) + " step(s)";
  if (r.samples_per_step > 0) {
    line += " (" + std::to_string(steps * r.samples_per_step) + " samples)";
  }
  return line + " after the snapshot are lost: trained again";
}

}  // namespace ddp::detail

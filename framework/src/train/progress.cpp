#include <ddp/train/progress.h>

#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

namespace ddp {

ProgressMode parse_progress_mode(const std::string& value) {
  if (value == "auto") return ProgressMode::Auto;
  if (value == "bar") return ProgressMode::Bar;
  if (value == "log") return ProgressMode::Log;
  if (value == "none") return ProgressMode::None;
  throw std::invalid_argument("progress mode '" + value + "': expected auto, bar, log or none");
}

namespace {

bool is_terminal_path(const std::string& path) {
  return path.rfind("/dev/pts/", 0) == 0 || path.rfind("/dev/tty", 0) == 0;
}

// The file behind a process's descriptor 1, from /proc; empty when unreadable.
std::string stdout_of(pid_t pid) {
  char target[4096];
  const std::string link = "/proc/" + std::to_string(pid) + "/fd/1";
  const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}

std::string command_of(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

}  // namespace

bool output_is_terminal() {
  if (!isatty(STDOUT_FILENO)) return false;
  const pid_t parent = getppid();
  const std::string launcher = command_of(parent);
  if (launcher == "mpirun" || launcher == "mpiexec" || launcher == "orterun" ||
      launcher == "prterun" || launcher == "orted" || launcher == "prted") {
    return is_terminal_path(stdout_of(parent));
  }
  return true;
}

int terminal_width() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  if (const char* columns = std::getenv("COLUMNS")) {
    const int n = std::atoi(columns);
    if (n > 0) return n;
  }
  return 100;
}

ProgressMode resolve_progress_mode(ProgressMode mode) {
  if (mode != ProgressMode::Auto) return mode;
  return output_is_terminal() ? ProgressMode::Bar : ProgressMode::Log;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
  }
  return text;
}

double eta_seconds(double elapsed, int64_t done, int64_t total) {
  if (done <= 0 || total < done || elapsed < 0) return -1;
  return elapsed / static_cast<double>(done) * static_cast<double>(total - done);
}

std::string format_progress_bar(int64_t epoch, int64_t done, int64_t total, double samples_per_sec,
                                double loss, double elapsed, int width) {
  const int digits = static_cast<int>(std::to_string(total).size());
  const double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 0;
  char head[96], tail[160];
  std::snprintf(head, sizeof head, "Epoch %lld [%*lld/%lld %3.0f%%] ",
                static_cast<long long>(epoch), digits, static_cast<long long>(done),
                static_cast<long long>(total), 100.0 * fraction);
  char loss_text[32] = "-";
  if (loss >= 0) std::snprintf(loss_text, sizeof loss_text, "%.4f", loss);
  std::snprintf(tail, sizeof tail, " %.0f samples/s loss %s %s<%s", samples_per_sec, loss_text,
                format_duration(elapsed).c_str(),
                format_duration(eta_seconds(elapsed, done, total)).c_str());
  const int room =
      width - static_cast<int>(std::string(head).size() + std::string(tail).size()) - 2;
  std::string bar;
  if (room >= 5) {
    const int cells = room > 30 ? 30 : room;
    const int filled = static_cast<int>(fraction * cells);
    bar = "|" + std::string(static_cast<size_t>(filled), '#') +
          std::string(static_cast<size_t>(cells - filled), '.') + "|";
  }
  std::string line = std::string(head) + bar + tail;
  if (width > 0 && static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
  return line;
}

}  // namespace ddp

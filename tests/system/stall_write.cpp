// Test-only LD_PRELOAD library: stops a process in the middle of writing a file, so that a test
// can kill it there, at a known point, instead of racing a write that takes milliseconds.
//
// The first write(2) to a file whose path contains $DDP_STALL_WRITE_TO writes half of its bytes,
// writes this process's id into $DDP_STALL_MARKER, and then waits until the process is killed.
// With $DDP_STALL_UNTIL naming a file, it instead writes the rest once that file exists (a test
// signals the stalled process meanwhile: a second stop signal while a snapshot is written).
// Every other write passes through unchanged.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" ssize_t write(int fd, const void* buf, size_t count) {
  using Write = ssize_t (*)(int, const void*, size_t);
  static const Write real = reinterpret_cast<Write>(dlsym(RTLD_NEXT, "write"));
  const char* pattern = std::getenv("DDP_STALL_WRITE_TO");
  const char* marker = std::getenv("DDP_STALL_MARKER");
  static std::atomic<bool> stalled{false};  // once per process
  if (pattern && marker && count > 1 && !stalled) {
    char link[64], target[4096];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) {
      target[n] = '\0';
      if (std::strstr(target, pattern) && !stalled.exchange(true)) {
        real(fd, buf, count / 2);
        const std::string pid = std::to_string(getpid()) + "\n";
        const std::string partial = std::string(marker) + ".part";
        const int out = open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out >= 0) {
          real(out, pid.data(), pid.size());
          close(out);
          rename(partial.c_str(), marker);  // the marker appears complete
        }
        if (const char* until = std::getenv("DDP_STALL_UNTIL")) {
          while (access(until, F_OK) != 0) usleep(10000);
          const ssize_t rest =
              real(fd, static_cast<const char*>(buf) + count / 2, count - count / 2);
          return rest < 0 ? rest : static_cast<ssize_t>(count / 2) + rest;
        }
        for (;;) pause();
      }
    }
  }
  return real(fd, buf, count);
}

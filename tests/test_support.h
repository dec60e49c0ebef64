#pragma once
// Helpers shared by the test files.

#include <ddp/parallel/process_group.h>
#include <ddp/runtime/runtime.h>

#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

namespace ddp_test {

// The process's Runtime in the multi-rank test binary (set by mpi_test_main.cpp).
ddp::Runtime& runtime();
// Its ProcessGroup (the communicators), made right after the Runtime.
ddp::ProcessGroup& group();

// Runs a command and returns its stdout; throws if it exits non-zero.
inline std::string run_command(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  std::string out;
  std::array<char, 1 << 16> buffer{};
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe.get())) > 0;) out.append(buffer.data(), n);
  const int status = pclose(pipe.release());
  if (status != 0) {
    throw std::runtime_error("command failed (status " + std::to_string(status) + "): " + command +
                             "\n(the reference tests need the torch of .venv, which scripts/setup.sh installs)");
  }
  return out;
}

// A fresh empty directory under the build tree's temporary area.
inline std::string make_temp_dir(const std::string& name) {
  std::string path = std::string(DDP_TEST_TMP) + "/" + name + "." + std::to_string(::getpid());
  run_command("rm -rf '" + path + "' && mkdir -p '" + path + "'");
  return path;
}

}  // namespace ddp_test

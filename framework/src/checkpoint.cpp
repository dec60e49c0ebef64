#include <ddp/checkpoint.h>

#include <c10/util/Exception.h>
#include <torch/serialize/output-archive.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace ddp {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) fail(path, "cannot open to sync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(path, "fsync failed");
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    try {
      write(tmp);
    } catch (const c10::Error& e) {
      throw std::runtime_error(path + ": cannot write: " + e.what_without_backtrace());
    }
    fsync_path(tmp, O_RDONLY);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "cannot rename " + tmp + " onto it");
    fsync_path(parent_dir(path), O_RDONLY | O_DIRECTORY);  // make the rename itself durable
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void save_module(const torch::nn::Module& module, const std::string& path) {
  write_atomically(path, [&](const std::string& tmp) {
    torch::serialize::OutputArchive archive;
    module.save(archive);
    archive.save_to(tmp);
  });
}

}  // namespace ddp

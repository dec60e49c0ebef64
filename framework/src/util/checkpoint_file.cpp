#include <ddp/checkpoint_file.h>

#include "util/file_error.h"
#include "util/host_name.h"

#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace ddp {

using detail::throw_file_error;

namespace {

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw_file_error(path, "cannot open to sync", errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) throw_file_error(path, "fsync failed", error);
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

const std::string kTmp = ".tmp.";

std::string temporary_path(const std::string& path) {
  return path + kTmp + detail::host_name() + "." + std::to_string(::getpid());
}

const char* const kKept =
    " (the temporary file is removed; the previous file, if any, is unchanged)";

}  // namespace

void write_atomically(const std::string& path, const void* data, std::size_t size) {
  const std::string tmp = temporary_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_file_error(path, "cannot create " + tmp, errno);
  // Clean-up on failure: close, remove the temporary file, report the first error's errno.
  auto give_up = [&](const std::string& what, int error) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": " + what + ": " + std::strerror(error) + kKept);
  };
  const char* next = static_cast<const char*>(data);
  std::size_t left = size;
  while (left > 0) {
    // At most 1 GiB per call: Linux writes at most 0x7ffff000 bytes at once anyway.
    const ssize_t n = ::write(fd, next, std::min<std::size_t>(left, std::size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) give_up("cannot write " + tmp, errno);
    if (n == 0) give_up("cannot write " + tmp + " (no progress)", EIO);
    next += n;
    left -= static_cast<std::size_t>(n);
  }
  // A file system may report a full disk only here (delayed allocation, NFS).
  if (::fsync(fd) != 0) give_up("cannot sync " + tmp, errno);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": cannot close " + tmp + ": " + std::strerror(error) + kKept);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename " + tmp + " onto it: " + std::strerror(error) +
                             kKept);
  }
  fsync_path(parent_dir(path), O_RDONLY | O_DIRECTORY);  // make the rename itself durable
}

void write_atomically(const std::string& path, const std::string& bytes) {
  write_atomically(path, bytes.data(), bytes.size());
}

void check_writable_directory(const std::string& dir, const std::string& what) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw std::runtime_error(dir + ": cannot create the " + what + ": " + error.message());
  // Named like our temporary files, so that a probe left by a killed run is removed as stale.
  const std::string probe =
      dir + "/.write_probe" + kTmp + detail::host_name() + "." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw_file_error(dir, "the " + what + " is not writable (cannot create a file in it)", errno);
  const ssize_t n = ::write(fd, "x", 1);
  const int write_error = errno;
  const int rc = ::close(fd);
  const int close_error = errno;
  ::unlink(probe.c_str());
  if (n != 1)
    throw_file_error(dir, "the " + what + " is not writable (cannot write a file in it)",
                     n < 0 ? write_error : EIO);
  if (rc != 0)
    throw_file_error(dir, "the " + what + " is not writable (cannot close a file in it)",
                     close_error);
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return removed;
  const std::string host = detail::host_name();
  const auto now = std::chrono::system_clock::now();
  auto all_digits = [](const std::string& s) {
    return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  while (const dirent* entry = ::readdir(d.get())) {
    const std::string name = entry->d_name;
    const auto at = name.rfind(kTmp);
    if (at == std::string::npos || at == 0) continue;
    const std::string tail = name.substr(at + kTmp.size());  // "<host>.<pid>" or "<pid>"
    const auto dot = tail.rfind('.');
    const std::string pid_text = dot == std::string::npos ? tail : tail.substr(dot + 1);
    const std::string writer_host = dot == std::string::npos ? host : tail.substr(0, dot);
    if (!all_digits(pid_text) || writer_host.empty()) continue;
    const std::string path = dir + "/" + name;
    struct stat info;
    if (::lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
    bool stale;
    if (writer_host == host) {
      const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
      // ESRCH: no such process. EPERM means it exists (another user's): keep the file.
      stale = pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
    } else {
      const auto modified = std::chrono::system_clock::from_time_t(info.st_mtime);
      stale = now - modified > std::chrono::hours(1);
    }
    if (stale && ::unlink(path.c_str()) == 0) removed.push_back(path);
  }
  return removed;
}

void save_module(const torch::nn::Module& module, const std::string& path) {
  std::string bytes;
  try {
    torch::serialize::OutputArchive archive;
    module.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    bytes = out.str();
  } catch (const c10::Error& e) {
    throw std::runtime_error(path + ": cannot serialise the model: " + e.what_without_backtrace());
  }
  write_atomically(path, bytes);
}

namespace {

void copy_into(torch::nn::Module& module, torch::serialize::InputArchive& archive,
               const std::string& prefix) {
  torch::NoGradGuard no_grad;
  auto copy = [&](const std::string& name, torch::Tensor& target, bool is_buffer) {
    torch::Tensor stored;
    archive.read(name, stored, is_buffer);
    if (!stored.sizes().equals(target.sizes())) {
      std::ostringstream msg;
      msg << "'" << prefix << name << "' has shape " << stored.sizes() << " in the file, "
          << target.sizes() << " in the model";
      throw std::runtime_error(msg.str());
    }
    target.copy_(stored);
  };
  for (auto& p : module.named_parameters(/*recurse=*/false)) copy(p.key(), p.value(), false);
  for (auto& b : module.named_buffers(/*recurse=*/false)) copy(b.key(), b.value(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;  // as Module::save skips it
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    copy_into(*child.value(), child_archive, prefix + child.key() + ".");
  }
}

}  // namespace

void load_module(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  try {
    copy_into(module, archive, "");
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

void load_module(torch::nn::Module& module, const std::string& path) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    load_module(module, archive);
  } catch (const c10::Error& e) {
    throw std::runtime_error(path + ": cannot load the model: " + e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": cannot load the model: " + e.what());
  }
}

}  // namespace ddp

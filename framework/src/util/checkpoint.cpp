#include <ddp/util/checkpoint.h>

#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
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

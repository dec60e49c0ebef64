#include "cli/memory_check.h"

#include <torch/torch.h>

#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace ddp {

namespace {

std::string human(uint64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1000 && unit < 6) value /= 1000, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, unit ? "%.1f %s" : "%.0f %s", value, units[unit]);
  return text;
}

// The first whole number in a file, or false (absent, "max", unreadable).
bool read_number(const std::string& path, uint64_t& value) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  try {
    value = std::stoull(word);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// Bytes allocated through malloc now: the main arena's chunks in use plus mmapped chunks.
uint64_t allocated_bytes() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

}  // namespace

HostMemory host_memory_available(const std::string& root) {
  HostMemory memory;
  std::ifstream meminfo(root + "/proc/meminfo");
  if (!meminfo) throw std::runtime_error(root + "/proc/meminfo: cannot read the available memory");
  bool found = false;
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    std::string unit;
    if (key == "MemAvailable:" && meminfo >> kib >> unit) {
      memory.available_bytes = kib * 1024;
      memory.source = "MemAvailable in /proc/meminfo";
      found = true;
      break;
    }
    std::getline(meminfo, unit);
  }
  if (!found) throw std::runtime_error(root + "/proc/meminfo: no MemAvailable line");

  // The process's cgroup: "0::/path" (v2) or "N:memory:/path" (v1), from /proc/self/cgroup.
  std::ifstream groups(root + "/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    std::string limit_file, usage_file;
    if (controllers.empty()) {
      limit_file = root + "/sys/fs/cgroup" + path + "/memory.max";
      usage_file = root + "/sys/fs/cgroup" + path + "/memory.current";
    } else if (controllers == "memory" || controllers.find("memory,") != std::string::npos ||
               controllers.find(",memory") != std::string::npos) {
      limit_file = root + "/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes";
      usage_file = root + "/sys/fs/cgroup/memory" + path + "/memory.usage_in_bytes";
    } else {
      continue;
    }
    uint64_t limit = 0, usage = 0;
    // v1 writes "no limit" as a huge number, v2 as "max" (read_number refuses it).
    if (!read_number(limit_file, limit) || limit >= (uint64_t{1} << 62)) continue;
    if (!read_number(usage_file, usage)) usage = 0;
    const uint64_t left = limit > usage ? limit - usage : 0;
    if (left < memory.available_bytes) {
      memory.available_bytes = left;
      memory.source = "the limit of cgroup " + path + " less its usage";
    }
  }
  return memory;
}

uint64_t training_bytes_per_sample(
    torch::nn::Module& model, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const std::vector<int64_t>& sample_shape, int64_t probe_samples) {
  if (probe_samples < 1) {
    throw std::invalid_argument("training_bytes_per_sample: probe_samples must be >= 1");
  }
  uint64_t pixels = 1;
  for (int64_t d : sample_shape) {
    if (d < 1)
      throw std::invalid_argument("training_bytes_per_sample: sample_shape has a size < 1");
    pixels *= static_cast<uint64_t>(d);
  }
  std::vector<int64_t> shape{probe_samples};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  const bool was_training = model.is_training();
  model.eval();
  uint64_t kept = 0;
  {
    torch::AutoGradMode grad(true);
    const torch::Tensor input = torch::zeros(shape);
    // Once unmeasured first, so that what a first forward sets up for good (caches, the thread
    // pools' buffers) is not counted per sample.
    forward(input);
    const uint64_t before = allocated_bytes();
    torch::Tensor output = forward(input);  // alive, with its graph, while measured
    const uint64_t after = allocated_bytes();
    kept = after > before ? after - before : 0;
  }
  model.train(was_training);
  return pixels * (sizeof(uint8_t) + sizeof(float)) + kept / static_cast<uint64_t>(probe_samples);
}

void require_batch_fits(const std::string& option, int64_t batch_size, uint64_t bytes_per_sample,
                        int ranks_on_node, const HostMemory& memory) {
  // In long double: a batch of 10^9 samples of megabytes each must not wrap around.
  const long double needed = static_cast<long double>(batch_size) *
                             static_cast<long double>(bytes_per_sample) *
                             static_cast<long double>(ranks_on_node < 1 ? 1 : ranks_on_node);
  if (needed <= static_cast<long double>(memory.available_bytes)) return;
  const uint64_t shown = needed >= static_cast<long double>(std::numeric_limits<uint64_t>::max())
                             ? std::numeric_limits<uint64_t>::max()
                             : static_cast<uint64_t>(needed);
  const int64_t fits = static_cast<int64_t>(
      static_cast<long double>(memory.available_bytes) /
      (static_cast<long double>(bytes_per_sample) * (ranks_on_node < 1 ? 1 : ranks_on_node)));
  std::ostringstream message;
  message << option << " cannot fit in memory: a training step needs at least " << human(shown)
          << " (" << ranks_on_node << " rank(s) on this node x " << batch_size << " samples x "
          << human(bytes_per_sample)
          << ": the batch's pixels as uint8 and float32 plus what forward keeps for backward), but "
          << human(memory.available_bytes) << " is available (" << memory.source
          << "); at most about " << fits << " samples per rank fit";
  throw std::runtime_error(message.str());
}

}  // namespace ddp

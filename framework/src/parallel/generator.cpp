#include "parallel/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/torch.h>

#include <mutex>
#include <optional>
#include <stdexcept>

namespace ddp {

namespace {

thread_local std::optional<at::Generator> t_generator;

// Held while the default CPU generator is seeded, drawn from by a constructor, and copied.
std::mutex& build_mutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace

at::Generator cpu_generator() {
  if (t_generator) return *t_generator;
  return at::globalContext().defaultGenerator(torch::kCPU);
}

ThreadCpuGenerator::ThreadCpuGenerator() {
  if (t_generator) throw std::logic_error("ThreadCpuGenerator: this thread already has one");
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>();
  {
    at::Generator global = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(global.mutex());
    generator.set_state(global.get_state());
  }
  t_generator = generator;
}

ThreadCpuGenerator::~ThreadCpuGenerator() { t_generator.reset(); }

void build_seeded(uint64_t seed, torch::Device device, const std::function<void()>& build) {
  if (!t_generator) {
    torch::manual_seed(seed);
    build();
    return;
  }
  std::lock_guard<std::mutex> lock(build_mutex());
  at::Generator global = at::globalContext().defaultGenerator(torch::kCPU);
  {
    std::lock_guard<std::mutex> guard(global.mutex());
    global.set_current_seed(seed);
  }
  if (device.is_cuda()) {
    at::Generator gpu = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> guard(gpu.mutex());
    gpu.set_current_seed(seed);
  }
  build();
  std::lock_guard<std::mutex> guard(global.mutex());
  t_generator->set_state(global.get_state());
}

}  // namespace ddp

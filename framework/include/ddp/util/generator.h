#pragma once
// The CPU random generator each replica draws from. LibTorch has one default CPU generator per
// process, seeded by torch::manual_seed; a rank draws its dropout masks from it. Replicas that
// share a process (--replicas-per-process) must not share it: their draws would interleave in
// whatever order the threads run, and no replica would draw what the rank it stands for draws.
// So each replica thread installs a generator of its own (ThreadCpuGenerator), and whatever draws
// for a replica asks cpu_generator(): the thread's generator where one is installed, LibTorch's
// default elsewhere (a plain one-replica process behaves exactly as before).
//
// LibTorch's module constructors draw their initial weights from the default generator, which
// nothing can redirect: build_seeded() builds under a process-wide lock, from the default
// generator seeded as torch::manual_seed would, and then hands the generator's state to the
// thread's own. Each replica therefore starts from exactly the state a rank would be in after
// `torch::manual_seed(seed); build();`, which makes N replicas in one process train what N ranks
// train.

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace ddp {

// The calling thread's CPU generator (shared handle, not a copy).
at::Generator cpu_generator();

// Installs a new CPU generator for the calling thread while it lives (not nestable: one per
// thread). Its state is a copy of the default generator's until build_seeded() seeds it.
class ThreadCpuGenerator {
 public:
  ThreadCpuGenerator();
  ~ThreadCpuGenerator();
  ThreadCpuGenerator(const ThreadCpuGenerator&) = delete;
  ThreadCpuGenerator& operator=(const ThreadCpuGenerator&) = delete;
};

// torch::manual_seed(seed), then build(), as one step for the calling thread's replica. Without a
// thread generator: exactly that. With one: under a process-wide lock, seeds LibTorch's default
// CPU generator (and `device`'s default generator when it is a CUDA device; no other device's,
// which another replica may be drawing from), runs build(), and copies the default CPU
// generator's state into the thread's.
void build_seeded(uint64_t seed, torch::Device device, const std::function<void()>& build);

}  // namespace ddp

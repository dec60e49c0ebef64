#pragma once
// The replica thread's own CPU generator behind cpu_generator() (<ddp/replicas.h> says why).

#include <ddp/replicas.h>

namespace ddp {

// Installs a new CPU generator for the calling thread while it lives (not nestable: one per
// thread); cpu_generator() returns it. Its state is a copy of the default generator's until
// build_seeded() seeds it. run_replicas() installs one in each replica thread.
class ThreadCpuGenerator {
 public:
  ThreadCpuGenerator();
  ~ThreadCpuGenerator();
  ThreadCpuGenerator(const ThreadCpuGenerator&) = delete;
  ThreadCpuGenerator& operator=(const ThreadCpuGenerator&) = delete;
};

}  // namespace ddp

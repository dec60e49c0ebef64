#pragma once
// The one place where tests reach into the library at points a user has no reason to: a rank
// that stops itself in a phase, emulated hosts for the hierarchical all-reduce, and the Trainer
// telling which step and samples it trained. Internal; only tests set them (directly, or through
// tests/system/testing_hooks_from_env.cpp). All empty by default, and then without effect.
//
// Set them before the work they watch starts and reset them when done: they are process-wide and
// called from whatever thread reaches the point, so a hook that keeps state must be thread-safe.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp::testing {

struct Hooks {
  // When a thread of this process enters a watched phase (<ddp/runtime.h>: WatchedPhase, the
  // start-up phases), with this process's rank (the launcher's before MPI is
  // up; -1 when unknown) and the phase's name.
  std::function<void(int rank, const std::string& phase)> entered_phase;
  // Ranks per emulated host in rank order (e.g. {2, 2}): the hosts the hierarchical all-reduce
  // sees instead of the ranks that share memory (CpuOptions::host_split). Empty: real hosts.
  std::vector<int> host_split;
  // After each optimizer step of a Trainer, with the global step (counting the steps before a
  // resume) and the group's rank.
  std::function<void(int64_t step, int rank)> after_step;
  // After the Trainer's step `step` (global, 1-based) has trained a batch: the indices (of the
  // training set) of the samples of epoch `epoch` that rank `rank` of `ranks` trained in it.
  std::function<void(int64_t epoch, int64_t step, int rank, int ranks,
                     const std::vector<int64_t>& samples)>
      trained_samples;
};

// The process's hooks, empty until a test sets them.
Hooks& hooks();

}  // namespace ddp::testing

#pragma once
// Sets ddp::testing::hooks().after_step (util/testing_hooks.h: called after each optimizer step
// of a Trainer with the global step and the rank) for its lifetime, then empties it.

#include "util/testing_hooks.h"

#include <cstdint>
#include <functional>
#include <utility>

namespace ddp_test {

class AfterStep {
 public:
  explicit AfterStep(std::function<void(int64_t step, int rank)> hook) {
    ddp::testing::hooks().after_step = std::move(hook);
  }
  ~AfterStep() { ddp::testing::hooks().after_step = nullptr; }
  AfterStep(const AfterStep&) = delete;
  AfterStep& operator=(const AfterStep&) = delete;
};

}  // namespace ddp_test

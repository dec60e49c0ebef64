#include "util/testing_hooks.h"

namespace ddp::testing {

Hooks& hooks() {
  static Hooks the_hooks;
  return the_hooks;
}

}  // namespace ddp::testing

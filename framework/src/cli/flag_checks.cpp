#include <ddp/cli/flag_checks.h>

#include "cli/number_text.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace ddp::cli {

void require_at_least(const char* flag, int64_t value, int64_t least) {
  if (value >= least) return;
  throw std::invalid_argument(std::string(flag) + " must be >= " + std::to_string(least) +
                              " (got " + std::to_string(value) + ")");
}

void require_finite(const char* flag, double value, double least, bool least_allowed) {
  // Written so that NaN fails: every comparison with NaN is false.
  if (std::isfinite(value) && (value > least || (least_allowed && value == least))) return;
  throw std::invalid_argument(std::string(flag) + " must be a finite number " +
                              (least_allowed ? ">= " : "> ") + short_text(least) + " (got " +
                              short_text(value) + ")");
}

void require_float_range(const char* flag, double value) {
  if (std::fabs(value) <= std::numeric_limits<float>::max()) return;
  throw std::invalid_argument(
      std::string(flag) + " must be at most " + short_text(std::numeric_limits<float>::max()) +
      ", the largest float the optimizer holds (got " + short_text(value) + ")");
}

}  // namespace ddp::cli

#pragma once
/// \file
/// Range checks for a program's own flags, with the message every ddp::cli flag error has:
/// the flag, what it must be, and the value given (`--gamma must be a finite number >= 0 (got
/// nan)`). ddp::cli::run turns the std::invalid_argument into that line on rank 0, status 2.

#include <cstdint>

namespace ddp::cli {

/// `value` >= `least`, else std::invalid_argument naming `flag` and the value.
void require_at_least(const char* flag, int64_t value, int64_t least);

/// A finite `value` > `least` (>= with `least_allowed`), else std::invalid_argument naming `flag`
/// and the value. NaN fails.
void require_finite(const char* flag, double value, double least, bool least_allowed);

/// |value| at most the largest float (3.4e38), else std::invalid_argument naming `flag`: LibTorch
/// keeps a float model's rates in float, and a larger one fails at the first step with an
/// overflow that names no flag. For the rates and factors of a program's own flags too.
void require_float_range(const char* flag, double value);

}  // namespace ddp::cli

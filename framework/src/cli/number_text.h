#pragma once
// Numbers in the cli's help and error text as a person writes them.

#include <sstream>
#include <string>

namespace ddp::cli {

// 0.1 as "0.1" in --help and errors, not Boost's round-trip "0.10000000000000001".
inline std::string short_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace ddp::cli

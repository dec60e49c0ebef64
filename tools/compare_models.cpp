// ddp_compare_models A.pt B.pt [C.pt ...]: compares the tensors of every file with the first
// file's, bit for bit, and prints each one that differs ("name<TAB>what"). Finds the replica
// that drifted when every rank saved its model. Exit status: 0 all identical, 1 some differ,
// 2 usage error or a file that cannot be read. --tolerance X accepts values that differ by at most
// X (the replica-equivalence tests: the same training reduced in another order).
#include <ddp/train/replica_check.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

namespace {

const char* const kUsage =
    "usage: ddp_compare_models A.pt B.pt [C.pt ...]\n"
    "       ddp_compare_models --tolerance X A.pt B.pt [C.pt ...]\n"
    "  Compares the tensors of each file (written by ddp::save_module) with those of A.pt, bit "
    "for\n"
    "  bit. Prints \"identical: A.pt B.pt\", or \"differ: A.pt B.pt (N tensors)\" followed by one\n"
    "  line per differing tensor: name<TAB>difference.\n"
    "  --tolerance X: tensors of the same dtype and shape whose values differ by at most X (max\n"
    "  abs difference) count as equal, and \"equal within X: A.pt B.pt (N tensors differ, by at\n"
    "  most D)\" is printed instead (for runs that reduce in another order).\n"
    "  Exit status: 0 all identical (or within the tolerance), 1 some differ, 2 usage error or\n"
    "  unreadable file.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::cout << kUsage;
    return 0;
  }
  int first = 1;
  double tolerance = -1;  // none: bit for bit
  if (argc > 2 && std::string(argv[1]) == "--tolerance") {
    char* end = nullptr;
    tolerance = std::strtod(argv[2], &end);
    if (end == argv[2] || *end != '\0' || !(tolerance >= 0) || !std::isfinite(tolerance)) {
      std::cerr << "ddp_compare_models: --tolerance must be a finite number >= 0 (got '" << argv[2]
                << "')\n";
      return 2;
    }
    first = 3;
  }
  if (argc - first < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string reference = argv[first];
  bool any_differ = false;
  try {
    for (int i = first + 1; i < argc; ++i) {
      const auto differences = ddp::compare_state_files(reference, argv[i]);
      if (differences.empty()) {
        std::cout << "identical: " << reference << " " << argv[i] << "\n";
        continue;
      }
      if (tolerance >= 0) {
        // Values only: a tensor that differs in shape or dtype, or is missing, never is.
        bool within = true;
        double largest = 0;
        for (const auto& d : differences) {
          const bool values = d.what.rfind("max abs difference", 0) == 0;
          within = within && values && d.max_abs_diff <= tolerance;  // NaN fails
          if (values) largest = std::max(largest, d.max_abs_diff);
        }
        if (within) {
          std::cout << "equal within " << tolerance << ": " << reference << " " << argv[i] << " ("
                    << differences.size()
                    << (differences.size() == 1 ? " tensor differs" : " tensors differ")
                    << ", by at most " << largest << ")\n";
          continue;
        }
      }
      any_differ = true;
      std::cout << "differ: " << reference << " " << argv[i] << " (" << differences.size()
                << (differences.size() == 1 ? " tensor)\n" : " tensors)\n");
      for (const auto& d : differences) std::cout << d.name << "\t" << d.what << "\n";
    }
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "ddp_compare_models: " << e.what() << "\n";
    return 2;
  }
  return any_differ ? 1 : 0;
}

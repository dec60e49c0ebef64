// ddp_compare_models A.pt B.pt [C.pt ...]: compares the tensors of every file with the first
// file's, bit for bit, and prints each one that differs ("name<TAB>what"). Finds the replica
// that drifted when every rank saved its model. Exit status: 0 all identical, 1 some differ,
// 2 usage error or a file that cannot be read.
#include <ddp/parallel/replica_check.h>

#include <exception>
#include <iostream>
#include <string>

namespace {

const char* const kUsage =
    "usage: ddp_compare_models A.pt B.pt [C.pt ...]\n"
    "  Compares the tensors of each file (written by ddp::save_module) with those of A.pt, bit for\n"
    "  bit. Prints \"identical: A.pt B.pt\", or \"differ: A.pt B.pt (N tensors)\" followed by one\n"
    "  line per differing tensor: name<TAB>difference.\n"
    "  Exit status: 0 all identical, 1 some differ, 2 usage error or unreadable file.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::cout << kUsage;
    return 0;
  }
  if (argc < 3) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string reference = argv[1];
  bool any_differ = false;
  try {
    for (int i = 2; i < argc; ++i) {
      const auto differences = ddp::compare_state_files(reference, argv[i]);
      if (differences.empty()) {
        std::cout << "identical: " << reference << " " << argv[i] << "\n";
        continue;
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

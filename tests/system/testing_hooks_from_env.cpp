// Linked into the test-only builds of the examples (ddp_mnist_signal_at_step,
// ddp_cifar_signal_at_step): before main, it turns these variables into the library's testing
// hooks (util/testing_hooks.h), so that the shell tests can drive a whole program from outside.
// libddp itself reads none of them.
//
//   DDP_TEST_STOP_IN_PHASE=RANK:TEXT  rank RANK stops itself (SIGSTOP) when it enters a watched
//                                     phase whose name starts with TEXT (a stuck file system, a
//                                     stopped node)
//   DDP_TEST_SAMPLE_LOG=DIR           every rank R of N appends "<epoch> <step> <index>" to
//                                     DIR/rank<R>of<N>.txt for each sample the Trainer trained
//                                     (once its step is done; <step>: global, 1-based), so a test
//                                     can check which samples an epoch trained across stops,
//                                     resumes and world sizes
//   DDP_TEST_HOST_SPLIT=2,2           ranks per emulated host for the hierarchical all-reduce
//
// A bad value ends the program before main with a message naming the variable.
#include "util/testing_hooks.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

[[noreturn]] void refuse(const char* name, const std::string& value, const char* expected) {
  std::fprintf(stderr, "%s='%s': expected %s\n", name, value.c_str(), expected);
  std::exit(2);
}

void stop_in_phase(const std::string& spec) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) refuse("DDP_TEST_STOP_IN_PHASE", spec, "RANK:PHASE");
  const std::string rank = spec.substr(0, colon), prefix = spec.substr(colon + 1);
  ddp::testing::hooks().entered_phase = [rank, prefix](int me, const std::string& phase) {
    if (rank == std::to_string(me) && phase.compare(0, prefix.size(), prefix) == 0)
      std::raise(SIGSTOP);
  };
}

void sample_log(const std::string& dir) {
  ddp::testing::hooks().trained_samples = [dir](int64_t epoch, int64_t step, int rank, int ranks,
                                                const std::vector<int64_t>& samples) {
    std::string lines;
    for (int64_t index : samples) {
      lines +=
          std::to_string(epoch) + " " + std::to_string(step) + " " + std::to_string(index) + "\n";
    }
    // Opened for each batch: the lines of every trained batch are on disk even when a rank is
    // killed (what the tests of crashes need).
    const std::string path =
        dir + "/rank" + std::to_string(rank) + "of" + std::to_string(ranks) + ".txt";
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "a"),
                                                         std::fclose);
    if (!file || std::fwrite(lines.data(), 1, lines.size(), file.get()) != lines.size()) {
      throw std::runtime_error("DDP_TEST_SAMPLE_LOG: cannot append to " + path);
    }
  };
}

void host_split(const std::string& text) {
  std::vector<int> split;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    const bool digits = !item.empty() && item.size() <= 6 &&
                        item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(item) == 0)
      refuse("DDP_TEST_HOST_SPLIT", text, "ranks per host, e.g. 2,2");
    split.push_back(std::stoi(item));
  }
  ddp::testing::hooks().host_split = split;
}

const bool installed = [] {
  if (const std::string spec = variable("DDP_TEST_STOP_IN_PHASE"); !spec.empty())
    stop_in_phase(spec);
  if (const std::string dir = variable("DDP_TEST_SAMPLE_LOG"); !dir.empty()) sample_log(dir);
  if (const std::string split = variable("DDP_TEST_HOST_SPLIT"); !split.empty()) host_split(split);
  return true;
}();

}  // namespace

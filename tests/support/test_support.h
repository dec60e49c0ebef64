#pragma once
// Helpers shared by the test files.

#include <ddp/train/image_dataset.h>
#include <ddp/train/mnist.h>
#include <ddp/train/snapshot.h>
#include <ddp/communicator.h>
#include <ddp/process_group.h>
#include <ddp/runtime.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp_test {

// Where the tests read Fashion-MNIST: DDP_MNIST_DIR when set (a GPU machine's unpacked copy,
// scripts/gpu_proof.sh), else Debian's dataset-fashion-mnist.
inline std::string mnist_dir() {
  const char* dir = std::getenv("DDP_MNIST_DIR");
  return dir != nullptr && *dir != '\0' ? dir : ddp::kDefaultMnistDir;
}

// The process's Runtime in the multi-rank test binary (set by mpi_test_main.cpp).
ddp::Runtime& runtime();
// Its ProcessGroup (the communicators), made right after the Runtime.
ddp::ProcessGroup& group();

// True on every rank iff every rank's tensor is bit-identical to rank 0's (collective over
// group()'s CPU communicator; multi-rank test binary only).
inline bool identical_on_all_ranks(const torch::Tensor& t) {
  const torch::Tensor all = group().cpu().all_gather(t.contiguous());
  for (int r = 1; r < runtime().world_size(); ++r) {
    if (!torch::equal(all[r], all[0])) return false;
  }
  return true;
}

// 100 random 3x8x8 images in 10 classes, the same on every rank.
inline ddp::ImageDataset small_images() {
  torch::manual_seed(7);
  return ddp::ImageDataset{torch::randint(0, 256, {100, 3, 8, 8}, torch::kByte),
                           torch::randint(0, 10, {100}, torch::kLong),
                           {0.5, 0.4, 0.3},
                           {0.2, 0.25, 0.3}};
}

// A small CNN for those images, the same weights on every rank.
inline torch::nn::Sequential small_cnn() {
  torch::manual_seed(1);
  return torch::nn::Sequential(torch::nn::Conv2d(3, 4, 3), torch::nn::ReLU(), torch::nn::Flatten(),
                               torch::nn::Linear(4 * 6 * 6, 10), torch::nn::LogSoftmax(1));
}

// A small MLP (6 -> 16 -> 8 -> 3, tanh), the same weights wherever it is built: optimizer tests
// compare two copies stepped two ways.
struct TinyMlpImpl : torch::nn::Module {
  TinyMlpImpl() {
    torch::manual_seed(1);
    a = register_module("a", torch::nn::Linear(6, 16));
    b = register_module("b", torch::nn::Linear(16, 8));
    c = register_module("c", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return c(torch::tanh(b(torch::tanh(a(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(TinyMlp);

// Runs a command and returns its stdout; throws if it exits non-zero.
inline std::string run_command(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  std::string out;
  std::array<char, 1 << 16> buffer{};
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe.get())) > 0;)
    out.append(buffer.data(), n);
  const int status = pclose(pipe.release());
  if (status != 0) {
    throw std::runtime_error(
        "command failed (status " + std::to_string(status) + "): " + command +
        "\n(the reference tests need the torch of .venv, which scripts/setup.sh installs)");
  }
  return out;
}

// A fresh empty directory under the build tree's temporary area.
inline std::string make_temp_dir(const std::string& name) {
  std::string path = std::string(DDP_TEST_TMP) + "/" + name + "." + std::to_string(::getpid());
  run_command("rm -rf '" + path + "' && mkdir -p '" + path + "'");
  return path;
}

// What a script of tests/reference run on rank 0 left for every rank: the fresh folder it was
// given and its standard output.
struct Reference {
  std::string dir, out;
};

// Runs tests/reference/<script>.py WORLD DIR on rank 0, WORLD being this job's world size (the
// script spawns that many PyTorch processes over gloo) and DIR a fresh folder, and gives every
// rank the result. Collective on group(): when the run failed, every rank throws, so that the
// ranks go on to the next test together instead of waiting in different collectives. PyTorch's
// run can itself crash (gloo, "terminate called without an active exception", seen in CI for
// join.py and powersgd.py): it gets one more try, in a fresh folder.
inline Reference run_gloo_reference(const std::string& script) {
  const std::string world = std::to_string(runtime().world_size());
  std::string result;  // from rank 0: the folder, a newline and the output; or "!" and why
  for (int attempt = 1; runtime().is_main() && attempt <= 2; ++attempt) {
    try {
      const std::string dir = make_temp_dir(script + "_np" + world);
      const std::string out =
          run_command(std::string(DDP_PYTHON) + " " + DDP_TEST_DIR + "/reference/" + script +
                      ".py " + world + " '" + dir + "'");
      result = dir + "\n" + out;
      break;
    } catch (const std::exception& e) {
      result = std::string("!") + e.what();
      std::fprintf(stderr, "reference %s, try %d of 2: %s\n", script.c_str(), attempt, e.what());
    }
  }
  result = ddp::all_gather_strings(group().cpu(), result)[0];
  if (result.front() == '!') throw std::runtime_error(script + ".py failed: " + result.substr(1));
  const size_t newline = result.find('\n');
  return Reference{result.substr(0, newline), result.substr(newline + 1)};
}

using Bytes = std::vector<uint8_t>;

// Writes `bytes` to `path`, replacing the file.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
inline void write_file(const std::string& path, const Bytes& bytes) {
  write_file(path, std::string(bytes.begin(), bytes.end()));
}

// The file's bytes ("" when it cannot be read).
inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline bool exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

inline std::string host() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Expects fn to throw E with a message containing every one of `parts`.
template <typename E = std::runtime_error, typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL() << "no exception";
  } catch (const E& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << part;
  }
}

// A single model's snapshot parts: `model` and `optimizer`, each under the name "".
inline ddp::SnapshotParts one_model(torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  return {{{"", &model}}, {{"", &optimizer}}};
}

}  // namespace ddp_test

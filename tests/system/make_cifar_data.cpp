// Writes a synthetic data set in CIFAR-10's binary format, for tests and demos that cannot
// download the real one:
//   make_cifar_data DIR [--train N] [--test M] [--seed S]
// DIR gets data_batch_1..5.bin (N records between them) and test_batch.bin (M records). Each
// class has its own colour and stripe pattern under strong per-pixel noise, which a small CNN
// learns well within one short epoch.
#include <ddp/train/cifar.h>

#include "cifar_writer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>

namespace {

constexpr int64_t kSide = 32;
constexpr double kTwoPi = 6.283185307179586;

struct Options {
  std::string dir;
  int64_t train = 5000;
  int64_t test = 1000;
  int64_t seed = 0;
};

int64_t parse_count(const std::string& flag, const std::string& value) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || n < 0) {
    throw std::invalid_argument("the argument ('" + value + "') for option '" + flag +
                                "' is invalid: expected a whole number >= 0");
  }
  return n;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--train" || arg == "--test" || arg == "--seed") {
      if (i + 1 == argc) throw std::invalid_argument("option '" + arg + "' needs a value");
      const int64_t value = parse_count(arg, argv[++i]);
      if (arg == "--train") {
        options.train = value;
      } else if (arg == "--test") {
        options.test = value;
      } else {
        options.seed = value;
      }
    } else if (arg.rfind("--", 0) == 0 || !options.dir.empty()) {
      throw std::invalid_argument("unexpected argument '" + arg + "'");
    } else {
      options.dir = arg;
    }
  }
  if (options.dir.empty()) throw std::invalid_argument("no output directory given");
  // Every file must hold at least one record: the reader refuses empty files.
  if (options.train < 5) throw std::invalid_argument("--train must be at least 5 (one per file)");
  if (options.test < 1) throw std::invalid_argument("--test must be at least 1");
  return options;
}

// `count` images with labels 0..9 in turn: the class colour (a corner of the RGB cube), plus
// stripes whose orientation and period depend on the class, plus Gaussian noise.
std::pair<torch::Tensor, torch::Tensor> synthesize(int64_t count, at::Generator& generator) {
  const torch::Tensor labels = torch::arange(count, torch::kLong).remainder(10);
  const torch::Tensor palette = torch::tensor({{200, 60, 60},
                                               {60, 200, 60},
                                               {60, 60, 200},
                                               {200, 200, 60},
                                               {200, 60, 200},
                                               {60, 200, 200},
                                               {128, 128, 128},
                                               {220, 140, 40},
                                               {40, 140, 220},
                                               {140, 40, 220}},
                                              torch::kFloat);
  const torch::Tensor colour = palette.index_select(0, labels).view({count, 3, 1, 1});

  const torch::Tensor position = torch::arange(kSide, torch::kFloat);
  const torch::Tensor period = (labels.remainder(5) + 3).to(torch::kFloat).view({count, 1, 1});
  const torch::Tensor phase = torch::rand({count, 1, 1}, generator) * period;
  const torch::Tensor along = torch::where(labels.ge(5).view({count, 1, 1}),
                                           position.view({1, 1, kSide}),   // vertical stripes
                                           position.view({1, kSide, 1}));  // horizontal stripes
  const torch::Tensor stripes =
      torch::sin((along + phase) * kTwoPi / period).mul(40).unsqueeze(1);  // [N,1,32,32]

  const torch::Tensor noise = torch::randn({count, 3, kSide, kSide}, generator).mul(45);
  const torch::Tensor images = (colour + stripes + noise).clamp(0, 255).round().to(torch::kByte);
  return {images, labels};
}

void write_dataset(const Options& options) {
  std::filesystem::create_directories(options.dir);
  at::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(options.seed));
  auto [train_images, train_labels] = synthesize(options.train, generator);
  // Shuffled so that every file holds a mix of classes, as in the real data set.
  const torch::Tensor order = torch::randperm(options.train, generator, torch::kLong);
  train_images = train_images.index_select(0, order);
  train_labels = train_labels.index_select(0, order);
  int64_t begin = 0;
  for (int64_t file = 0; file < 5; ++file) {
    const int64_t size = options.train / 5 + (file < options.train % 5 ? 1 : 0);
    ddp_test::write_cifar10_file(options.dir + "/data_batch_" + std::to_string(file + 1) + ".bin",
                                 train_images.narrow(0, begin, size),
                                 train_labels.narrow(0, begin, size));
    begin += size;
  }
  const auto [test_images, test_labels] = synthesize(options.test, generator);
  ddp_test::write_cifar10_file(options.dir + "/test_batch.bin", test_images, test_labels);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "make_cifar_data: " << e.what()
              << "\nusage: make_cifar_data DIR [--train N] [--test M] [--seed S]\n";
    return 2;
  }
  try {
    write_dataset(options);
  } catch (const std::exception& e) {
    std::cerr << "make_cifar_data: " << e.what() << "\n";
    return 1;
  }
  std::cout << "make_cifar_data: wrote " << options.train << " training and " << options.test
            << " test images to " << options.dir << "\n";
  return 0;
}

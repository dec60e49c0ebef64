// What each part of the Trainer's data phase costs the host, on one device: the gather of a
// batch (data set resident on the device, and, on a GPU, from host memory), RandomCropFlip,
// ImageDataset::normalise, and the two together as mnist's and ddp_cifar's data phases make them.
// On a GPU the step is bound by the host issuing work, so the data phase's share of the step is
// the host's time to issue these calls, not the GPU's time to run them: "host" is the time until
// the call returns, "synced" until the device has finished it too. One further row times the
// normalisation with its per-channel constants made once instead of in every call, the cheapest
// the same arithmetic can be issued, to show what the constants' copy costs.
//   bench_data_path [cpu|cuda] [BATCH] [ITERATIONS]        (default: cuda when there is one, 256,
//   2000)
// Prints one table in microseconds a call: the first call, then, after 50 more to warm up, the
// mean, median and 90th percentile until the call returns, and the mean and median until the
// device is done.
#include <ddp/train/augment.h>
#include <ddp/train/image_dataset.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

struct Timing {
  double mean, median, p90;
};

Timing summary(std::vector<double> micros) {
  double sum = 0;
  for (double us : micros) sum += us;
  std::sort(micros.begin(), micros.end());
  return {sum / static_cast<double>(micros.size()), micros[micros.size() / 2],
          micros[micros.size() * 9 / 10]};
}

void synchronize(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Times `call` one call at a time: until it returns, and (another pass) until the device is done.
// The first call of the first pass is reported alone: it pays for first-time work (a kernel's
// first launch, the first pinned buffer), which an epoch's mean includes once.
void row(const char* name, int iterations, torch::Device device,
         const std::function<torch::Tensor(int)>& call) {
  std::vector<double> host, synced;
  double first = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = -50; i < iterations; ++i) {  // 50 to warm up
      synchronize(device);
      const auto start = std::chrono::steady_clock::now();
      torch::Tensor out = call(i + 50);
      if (pass == 1) synchronize(device);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
      if (pass == 0 && i == -50) first = us;
      if (i >= 0) (pass == 0 ? host : synced).push_back(us);
    }
  }
  const Timing h = summary(host), s = summary(synced);
  std::printf("| %-42s | %9.1f | %8.1f | %8.1f | %8.1f | %8.1f | %8.1f |\n", name, first, h.mean,
              h.median, h.p90, s.mean, s.median);
}

// A data set of n random images [n, channels, size, size] with the given mean and stddev.
ddp::ImageDataset synthetic(int64_t n, int64_t channels, int64_t size, std::vector<double> mean,
                            std::vector<double> stddev) {
  return ddp::ImageDataset{torch::randint(0, 256, {n, channels, size, size}, torch::kByte),
                           torch::randint(0, 10, {n}, torch::kLong), std::move(mean),
                           std::move(stddev)};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string where = argc > 1 ? argv[1] : (torch::cuda::is_available() ? "cuda" : "cpu");
  const int64_t batch = argc > 2 ? std::stoll(argv[2]) : 256;
  const int iterations = argc > 3 ? std::stoi(argv[3]) : 2000;
  if (where != "cpu" && where != "cuda") {
    std::fprintf(stderr, "bench_data_path: the device must be cpu or cuda, not '%s'\n", argv[1]);
    return 2;
  }
  if (where == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_data_path: no CUDA device\n");
    return 2;
  }
  const torch::Device device = where == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
  torch::manual_seed(0);
  const ddp::ImageDataset mnist_host = synthetic(60000, 1, 28, {0.1307}, {0.3081});
  const ddp::ImageDataset cifar_host =
      synthetic(50000, 3, 32, {0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616});
  const ddp::ImageDataset mnist = mnist_host.to(device), cifar = cifar_host.to(device);
  const torch::Tensor order = torch::randperm(50000, torch::kLong);
  const std::vector<int64_t> indices(order.data_ptr<int64_t>(),
                                     order.data_ptr<int64_t>() + order.numel());
  const int64_t batches = static_cast<int64_t>(indices.size()) / batch;
  auto begin = [&](int i) { return (i % batches) * batch; };
  const ddp::RandomCropFlip crop_flip;
  at::Generator generator = ddp::augmentation_generator(0, 0, 0);
  // Batches of pixels without a gather, so that the gather's first call is its first.
  const torch::Tensor mnist_pixels = mnist.images.slice(0, 0, batch).clone();
  const torch::Tensor cifar_pixels = cifar.images.slice(0, 0, batch).clone();

  std::printf("bench_data_path: device %s, batch %lld, %d calls a row, microseconds a call\n\n",
              device.str().c_str(), static_cast<long long>(batch), iterations);
  std::printf("| %-42s | %9s | %8s | %8s | %8s | %8s | %8s |\n", "part", "1st call", "host",
              "median", "p90", "synced", "median");
  std::printf("|%s|----------:|---------:|---------:|---------:|---------:|---------:|\n",
              std::string(44, '-').c_str());
  row("gather, mnist resident", iterations, device,
      [&](int i) { return mnist.gather(indices, begin(i), begin(i) + batch, device).inputs; });
  if (device.is_cuda()) {
    row("gather, mnist from host memory", iterations, device, [&](int i) {
      return mnist_host.gather(indices, begin(i), begin(i) + batch, device).inputs;
    });
  }
  row("normalise, 1 channel", iterations, device,
      [&](int) { return mnist.normalise(mnist_pixels); });
  // The same arithmetic as ImageDataset::normalise, its constants made once, outside the call.
  const torch::Tensor scale =
      torch::tensor(cifar.stddev, torch::kDouble).to(torch::kFloat).view({1, 3, 1, 1}).to(device);
  const torch::Tensor shift =
      torch::tensor(cifar.mean, torch::kDouble).to(torch::kFloat).view({1, 3, 1, 1}).to(device);
  row("normalise, 3 channels", iterations, device,
      [&](int) { return cifar.normalise(cifar_pixels); });
  row("normalise, 3 channels, constants made once", iterations, device,
      [&](int) { return cifar_pixels.to(torch::kFloat).div_(255.0f).sub_(shift).div_(scale); });
  row("RandomCropFlip, cifar", iterations, device,
      [&](int) { return crop_flip(cifar_pixels, generator); });
  row("mnist's data phase", iterations, device, [&](int i) {
    return mnist.normalise(mnist.gather(indices, begin(i), begin(i) + batch, device).inputs);
  });
  row("ddp_cifar's data phase", iterations, device, [&](int i) {
    const ddp::Batch raw = cifar.gather(indices, begin(i), begin(i) + batch, device);
    return cifar.normalise(crop_flip(raw.inputs, generator));
  });
  return 0;
}

// The data path on a GPU does not make the host wait for the GPU (docs/gpu.md, "The data path"):
// gathering a batch of a data set resident on the GPU or in host memory, the crops and flips,
// and the normalisation each make small tensors on the host (indices, offsets, the per-channel
// constants) and copy them over; a plain copy would first wait for every kernel queued on the
// current stream, and the Trainer's data phase would then time the previous step's GPU work.
// Each test queues half a second of GPU sleep, runs one part of the data path, and checks the
// sleep is still running when it returns; then that the result equals the CPU's. And the
// Trainer's step waits for the GPU before its optimizer step only, never after it; its epoch
// reports the GPU memory peak.
#include <ddp/train/augment.h>
#include <ddp/train/image_dataset.h>
#include <ddp/train/train.h>

#include "after_step_hook.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace {

constexpr int64_t kSleepCycles = 1'000'000'000;  // about half a second of GPU time

class GpuData : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ddp_test::group().has_gpu()) GTEST_SKIP() << "no CUDA device on this rank";
  }
  torch::Device device() const { return ddp_test::runtime().device(); }

  // Runs `part` once to load its kernels (CUDA loads a kernel's module at its first launch, which
  // may synchronize the context), then again behind the sleep, and says whether the host waited.
  bool waits_for_the_gpu(const std::function<void()>& part) const {
    part();
    torch::cuda::synchronize();
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device().index());
    at::cuda::sleep(kSleepCycles);
    part();
    const bool waited = current.query();
    torch::cuda::synchronize();
    return waited;
  }
};

ddp::ImageDataset small_dataset(int64_t channels) {
  torch::manual_seed(3);
  ddp::ImageDataset data;
  data.images = torch::randint(0, 256, {40, channels, 12, 12}, torch::kLong).to(torch::kByte);
  data.labels = torch::randint(0, 10, {40}, torch::kLong);
  data.mean = std::vector<double>(static_cast<size_t>(channels), 0.25);
  data.stddev = std::vector<double>(static_cast<size_t>(channels), 0.5);
  if (channels == 3) {
    data.mean = {0.4914, 0.4822, 0.4465};
    data.stddev = {0.2470, 0.2435, 0.2616};
  }
  return data;
}

const std::vector<int64_t> kIndices{7, 3, 31, 0, 12, 25, 39, 18};

TEST_F(GpuData, GatherFromTheGpuDoesNotWait) {
  const ddp::ImageDataset on_cpu = small_dataset(3);
  const ddp::ImageDataset resident = on_cpu.to(device());
  ddp::Batch batch;
  EXPECT_FALSE(waits_for_the_gpu([&] { batch = resident.gather(kIndices, 0, 8, device()); }));
  const ddp::Batch want = on_cpu.gather(kIndices, 0, 8, torch::kCPU);
  EXPECT_TRUE(torch::equal(batch.inputs.cpu(), want.inputs));
  EXPECT_TRUE(torch::equal(batch.targets.cpu(), want.targets));
}

TEST_F(GpuData, GatherFromHostMemoryDoesNotWait) {
  const ddp::ImageDataset on_cpu = small_dataset(1);
  ddp::Batch batch;
  EXPECT_FALSE(waits_for_the_gpu([&] { batch = on_cpu.gather(kIndices, 2, 8, device()); }));
  EXPECT_TRUE(batch.inputs.is_cuda());
  const ddp::Batch want = on_cpu.gather(kIndices, 2, 8, torch::kCPU);
  EXPECT_TRUE(torch::equal(batch.inputs.cpu(), want.inputs));
  EXPECT_TRUE(torch::equal(batch.targets.cpu(), want.targets));
}

TEST_F(GpuData, NormaliseDoesNotWait) {
  for (const int64_t channels : {1, 3}) {
    const ddp::ImageDataset data = small_dataset(channels);
    const torch::Tensor pixels = data.images.slice(0, 0, 8).to(device());
    torch::Tensor normalised;
    EXPECT_FALSE(waits_for_the_gpu([&] { normalised = data.normalise(pixels); })) << channels;
    // The same arithmetic on either device; CUDA may divide by a scalar as a multiplication by
    // its reciprocal, so within a float's rounding, not bit for bit.
    const torch::Tensor want = data.normalise(data.images.slice(0, 0, 8));
    EXPECT_TRUE(torch::allclose(normalised.cpu(), want, 1e-6, 1e-6)) << channels;
  }
}

TEST_F(GpuData, CropAndFlipDoNotWait) {
  const torch::Tensor images = small_dataset(3).images.slice(0, 0, 8);
  const torch::Tensor resident = images.to(device());
  const ddp::RandomCropFlip augment;
  at::Generator generator = ddp::augmentation_generator(4, 0, 1);
  torch::Tensor on_gpu;
  EXPECT_FALSE(waits_for_the_gpu([&] { on_gpu = augment(resident, generator); }));
  // The second call's draws, made again on the CPU.
  at::Generator replay = ddp::augmentation_generator(4, 0, 1);
  (void)augment(images, replay);
  EXPECT_TRUE(torch::equal(on_gpu.cpu(), augment(images, replay)));
}

// SGD that queues the GPU sleep after its step: whatever of the Trainer's step comes after the
// optimizer's step then finds the GPU busy, unless it waits for it.
struct SleepAfterStep : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::Tensor loss = torch::optim::SGD::step(std::move(closure));
    at::cuda::sleep(kSleepCycles / 8);
    return loss;
  }
};

TEST_F(GpuData, TrainerDoesNotWaitAfterTheOptimizerStep) {
  const ddp::ImageDataset data = small_dataset(1).to(device());
  auto net = torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(144, 10),
                                   torch::nn::LogSoftmax(1));
  net->to(device());
  SleepAfterStep optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device().index());
  std::vector<bool> idle_after_step;
  ddp::TrainerOptions options;
  options.batch_size = 8;  // 5 steps
  options.report.log_interval = 0;
  ddp_test::AfterStep hook([&](int64_t, int) { idle_after_step.push_back(current.query()); });
  ddp::ClassificationTask task(data, nullptr,
                               [&](const torch::Tensor& x) { return net->forward(x); });
  ddp::Trainer trainer(ddp_test::group(), *net, task, optimizer, options);
  const ddp::EpochResult result = trainer.train_epoch(1);
  torch::cuda::synchronize();
  // The data set lives on the GPU through the epoch: the peak holds at least its bytes.
  EXPECT_GE(result.gpu_memory_peak_mb * 1024 * 1024, static_cast<double>(data.bytes()));
  ASSERT_EQ(idle_after_step.size(), 5u);
  // The first step loads kernels (which may synchronize); from the second on, none may wait.
  for (size_t i = 1; i < idle_after_step.size(); ++i) {
    EXPECT_FALSE(idle_after_step[i]) << "the Trainer waited for the GPU after step " << i + 1;
  }
}

}  // namespace

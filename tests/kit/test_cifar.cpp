#include <ddp/train/augment.h>
#include <ddp/train/cifar.h>

#include "cifar_writer.h"
#include "test_support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

using ddp_test::Bytes;
using ddp_test::expect_error;
using ddp_test::write_file;

constexpr int64_t kRecord = 3073;

// Record i: label i % 10, pixel byte k (k = 0..3071) = (7 * i + k) % 251.
Bytes records(int64_t count) {
  Bytes b;
  for (int64_t i = 0; i < count; ++i) {
    b.push_back(static_cast<uint8_t>(i % 10));
    for (int64_t k = 0; k < kRecord - 1; ++k) b.push_back(static_cast<uint8_t>((7 * i + k) % 251));
  }
  return b;
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

torch::Tensor random_images(int64_t n, int64_t seed) {
  return torch::randint(0, 256, {n, 3, 32, 32}, at::detail::createCPUGenerator(seed), torch::kByte);
}

TEST(CifarReader, ReadsTheBinaryLayout) {
  const std::string dir = ddp_test::make_temp_dir("cifar_layout");
  const Bytes bytes = records(3);
  write_file(dir + "/three.bin", bytes);
  const ddp::ImageDataset data = ddp::read_cifar10_file(dir + "/three.bin");
  ASSERT_EQ(data.images.sizes(), (std::vector<int64_t>{3, 3, 32, 32}));
  EXPECT_EQ(data.images.dtype(), torch::kByte);
  EXPECT_TRUE(data.images.is_contiguous());
  EXPECT_TRUE(torch::equal(data.labels, torch::tensor({0, 1, 2}, torch::kLong)));
  // Byte 0 is the label, then the red, green and blue planes, each row-major.
  const auto pixels = data.images.accessor<uint8_t, 4>();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t y = 0; y < 32; ++y) {
        for (int64_t x = 0; x < 32; ++x) {
          ASSERT_EQ(pixels[i][c][y][x], bytes[i * kRecord + 1 + 1024 * c + 32 * y + x])
              << "image " << i << " channel " << c << " y " << y << " x " << x;
        }
      }
    }
  }
  EXPECT_EQ(data.mean, (std::vector<double>{0.4914, 0.4822, 0.4465}));
  EXPECT_EQ(data.stddev, (std::vector<double>{0.2470, 0.2435, 0.2616}));
}

TEST(CifarReader, SingleRecordFile) {
  const std::string dir = ddp_test::make_temp_dir("cifar_single");
  Bytes bytes = records(1);
  bytes[0] = 9;
  write_file(dir + "/one.bin", bytes);
  const ddp::ImageDataset data = ddp::read_cifar10_file(dir + "/one.bin");
  EXPECT_EQ(data.images.sizes(), (std::vector<int64_t>{1, 3, 32, 32}));
  EXPECT_TRUE(data.images.is_contiguous());
  EXPECT_EQ(data.labels.item<int64_t>(), 9);
  EXPECT_EQ(data.images[0][2][31][31].item<int>(), bytes[kRecord - 1]);
}

TEST(CifarWriter, RoundTripsPixelsAndLabelsInTheBinaryLayout) {
  const std::string dir = ddp_test::make_temp_dir("cifar_round_trip");
  const torch::Tensor images = random_images(4, 1);
  const torch::Tensor labels = torch::tensor({3, 9, 0, 3}, torch::kLong);
  ddp_test::write_cifar10_file(dir + "/batch.bin", images, labels);

  const Bytes bytes = read_file(dir + "/batch.bin");
  ASSERT_EQ(bytes.size(), static_cast<size_t>(4 * kRecord));
  EXPECT_EQ(bytes[0], 3);
  EXPECT_EQ(bytes[kRecord], 9);
  EXPECT_EQ(bytes[1 + 32 * 5 + 7], images[0][0][5][7].item<int>());                 // red
  EXPECT_EQ(bytes[kRecord + 1 + 1024 + 32 * 31], images[1][1][31][0].item<int>());  // green
  EXPECT_EQ(bytes[3 * kRecord + 1 + 2048 + 32 * 2 + 30], images[3][2][2][30].item<int>());

  const ddp::ImageDataset back = ddp::read_cifar10_file(dir + "/batch.bin");
  EXPECT_TRUE(torch::equal(back.images, images));
  EXPECT_TRUE(torch::equal(back.labels, labels));
}

TEST(CifarWriter, RejectsBadTensorsNamingTheFile) {
  const std::string path = ddp_test::make_temp_dir("cifar_writer_bad") + "/out.bin";
  const torch::Tensor images = random_images(2, 2);
  const torch::Tensor labels = torch::tensor({1, 2}, torch::kLong);
  using Invalid = std::invalid_argument;
  expect_error<Invalid>(
      [&] { ddp_test::write_cifar10_file(path, images.to(torch::kFloat), labels); },
      {path, "uint8 [N,3,32,32]", "Float"});
  expect_error<Invalid>(
      [&] { ddp_test::write_cifar10_file(path, images.narrow(2, 0, 28), labels); },
      {path, "[2,3,28,32]"});
  expect_error<Invalid>([&] { ddp_test::write_cifar10_file(path, images, labels.narrow(0, 0, 1)); },
                        {path, "int64 [2]", "[1]"});
  expect_error<Invalid>([&] { ddp_test::write_cifar10_file(path, images, labels.to(torch::kInt)); },
                        {path, "int64 [2]"});
  expect_error<Invalid>(
      [&] {
        ddp_test::write_cifar10_file(path, images, torch::tensor({1, 10}, torch::kLong));
      },
      {path, "0..9", "10"});
  expect_error<Invalid>(
      [&] {
        ddp_test::write_cifar10_file(path, images, torch::tensor({-1, 1}, torch::kLong));
      },
      {path, "0..9", "-1"});
  expect_error<Invalid>(
      [&] { ddp_test::write_cifar10_file(path, images.narrow(0, 0, 0), labels.narrow(0, 0, 0)); },
      {path, "no images"});
  EXPECT_FALSE(std::ifstream(path).good());
}

TEST(CifarReader, BadFilesNameTheFileAndTheFault) {
  const std::string dir = ddp_test::make_temp_dir("cifar_bad");
  expect_error([&] { ddp::read_cifar10_file(dir + "/absent.bin"); },
               {dir + "/absent.bin", "no such file"});

  write_file(dir + "/empty.bin", "");
  expect_error([&] { ddp::read_cifar10_file(dir + "/empty.bin"); }, {dir + "/empty.bin", "empty"});

  Bytes truncated = records(2);
  truncated.resize(truncated.size() - 100);
  write_file(dir + "/truncated.bin", truncated);
  expect_error([&] { ddp::read_cifar10_file(dir + "/truncated.bin"); },
               {dir + "/truncated.bin", "size 6046 bytes", "3073", "remainder 2973"});

  Bytes label = records(4);
  label[2 * kRecord] = 10;
  write_file(dir + "/label.bin", label);
  expect_error([&] { ddp::read_cifar10_file(dir + "/label.bin"); },
               {dir + "/label.bin", "record 2", "label 10"});

  expect_error([&] { ddp::read_cifar10_file(dir); }, {dir, "not a regular file"});
}

TEST(CifarLoader, ConcatenatesTheFiveTrainFilesInOrder) {
  const std::string dir = ddp_test::make_temp_dir("cifar_load");
  std::vector<torch::Tensor> images;
  std::vector<torch::Tensor> labels;
  for (int64_t file = 1; file <= 5; ++file) {
    // File f holds f images, all labelled f (test_batch: 0), so the order shows in the labels.
    images.push_back(random_images(file, file));
    labels.push_back(torch::full({file}, file, torch::kLong));
    ddp_test::write_cifar10_file(dir + "/data_batch_" + std::to_string(file) + ".bin",
                                 images.back(), labels.back());
  }
  const torch::Tensor test_images = random_images(2, 7);
  ddp_test::write_cifar10_file(dir + "/test_batch.bin", test_images,
                               torch::zeros({2}, torch::kLong));

  const ddp::ImageDataset train = ddp::load_cifar10(dir, ddp::CifarSplit::Train);
  EXPECT_EQ(train.size(), 15);
  EXPECT_TRUE(torch::equal(train.images, torch::cat(images)));
  EXPECT_TRUE(torch::equal(train.labels, torch::cat(labels)));
  EXPECT_EQ(train.mean.size(), 3u);

  const ddp::ImageDataset test = ddp::load_cifar10(dir, ddp::CifarSplit::Test);
  EXPECT_TRUE(torch::equal(test.images, test_images));
  EXPECT_TRUE(torch::equal(test.labels, torch::zeros({2}, torch::kLong)));
  EXPECT_EQ(test.stddev, train.stddev);

  std::remove((dir + "/data_batch_4.bin").c_str());
  expect_error([&] { ddp::load_cifar10(dir, ddp::CifarSplit::Train); },
               {dir + "/data_batch_4.bin", "no such file", "scripts/download_cifar10.sh"});
  std::remove((dir + "/test_batch.bin").c_str());
  expect_error([&] { ddp::load_cifar10(dir, ddp::CifarSplit::Test); },
               {dir + "/test_batch.bin", "scripts/download_cifar10.sh"});
}

TEST(CifarLoader, DefaultDirectoryIsWhereTheScriptUnpacks) {
  EXPECT_STREQ(ddp::kDefaultCifar10Dir, "data/cifar-10-batches-bin");
  std::ifstream script(std::string(DDP_TEST_DIR) + "/../scripts/download_cifar10.sh");
  const std::string text(std::istreambuf_iterator<char>(script), {});
  EXPECT_NE(text.find(ddp::kDefaultCifar10Dir), std::string::npos);
}

// ---- augmentation ----

// Where sample `out` could have come from in the zero-padded `padded` sample: every
// (top, left, mirrored) whose window, mirrored or not, equals it.
std::vector<std::tuple<int64_t, int64_t, bool>> windows_matching(const torch::Tensor& padded,
                                                                 const torch::Tensor& out,
                                                                 int64_t padding) {
  std::vector<std::tuple<int64_t, int64_t, bool>> found;
  const int64_t height = out.size(1);
  const int64_t width = out.size(2);
  for (int64_t top = 0; top <= 2 * padding; ++top) {
    for (int64_t left = 0; left <= 2 * padding; ++left) {
      const torch::Tensor window = padded.narrow(1, top, height).narrow(2, left, width);
      for (bool mirrored : {false, true}) {
        if (torch::equal(mirrored ? window.flip({2}) : window, out)) {
          found.emplace_back(top, left, mirrored);
        }
      }
    }
  }
  return found;
}

TEST(Augment, GeneratorDependsOnSeedRankAndEpoch) {
  auto first_draws = [](at::Generator g) { return torch::randint(0, 1 << 30, {8}, g); };
  const torch::Tensor base = first_draws(ddp::augmentation_generator(5, 1, 2));
  EXPECT_TRUE(torch::equal(base, first_draws(ddp::augmentation_generator(5, 1, 2))));
  EXPECT_FALSE(torch::equal(base, first_draws(ddp::augmentation_generator(6, 1, 2))));
  EXPECT_FALSE(torch::equal(base, first_draws(ddp::augmentation_generator(5, 0, 2))));
  EXPECT_FALSE(torch::equal(base, first_draws(ddp::augmentation_generator(5, 1, 3))));
  EXPECT_FALSE(torch::equal(base, first_draws(ddp::augmentation_generator(5, 2, 1))));
  EXPECT_TRUE(ddp::augmentation_generator(5, 1, 2).device().is_cpu());
}

TEST(RandomCropFlip, SameGeneratorSameOutputOtherEpochOrRankDiffers) {
  const torch::Tensor images = random_images(16, 3);
  const ddp::RandomCropFlip augment;
  auto run = [&](int rank, int64_t epoch) {
    at::Generator g = ddp::augmentation_generator(42, rank, epoch);
    return augment(images, g);
  };
  const torch::Tensor out = run(0, 0);
  EXPECT_TRUE(torch::equal(out, run(0, 0)));
  EXPECT_FALSE(torch::equal(out, run(0, 1)));
  EXPECT_FALSE(torch::equal(out, run(1, 0)));
  EXPECT_FALSE(torch::equal(out, images));
  EXPECT_EQ(out.sizes(), images.sizes());
  EXPECT_EQ(out.dtype(), torch::kByte);

  // The generator advances: a second batch gets fresh draws.
  at::Generator g = ddp::augmentation_generator(42, 0, 0);
  augment(images, g);
  EXPECT_FALSE(torch::equal(augment(images, g), out));
}

TEST(RandomCropFlip, NoPaddingNoFlipIsACopy) {
  const torch::Tensor images = random_images(4, 4);
  at::Generator g = ddp::augmentation_generator(1, 0, 0);
  const torch::Tensor out = ddp::RandomCropFlip{0, false}(images, g);
  EXPECT_TRUE(torch::equal(out, images));
  EXPECT_NE(out.data_ptr(), images.data_ptr());
}

TEST(RandomCropFlip, FlipOnlyMirrorsSomeSamplesAndKeepsTheOthers) {
  const torch::Tensor images = random_images(64, 5);
  at::Generator g = ddp::augmentation_generator(7, 0, 0);
  const torch::Tensor out = ddp::RandomCropFlip{0, true}(images, g);
  int kept = 0;
  int mirrored = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const bool same = torch::equal(out[i], images[i]);
    const bool flipped = torch::equal(out[i], images[i].flip({2}));
    EXPECT_NE(same, flipped) << "sample " << i;
    kept += same;
    mirrored += flipped;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(mirrored, 0);
  EXPECT_EQ(kept + mirrored, 64);
}

TEST(RandomCropFlip, EverySampleIsAWindowOfTheZeroPaddedInput) {
  // Random pixels make every window unique, so exactly one (offset, flip) explains each sample.
  // A non-square case catches rows and columns swapped.
  for (const auto& [shape, padding] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{
           {{8, 3, 32, 32}, 4}, {{12, 2, 5, 9}, 2}}) {
    const torch::Tensor images =
        torch::randint(1, 256, shape, at::detail::createCPUGenerator(9), torch::kByte);
    at::Generator g = ddp::augmentation_generator(3, 0, 0);
    const torch::Tensor out = ddp::RandomCropFlip{padding, true}(images, g);
    ASSERT_EQ(out.sizes(), images.sizes());
    const torch::Tensor padded =
        torch::constant_pad_nd(images, {padding, padding, padding, padding});
    std::set<std::tuple<int64_t, int64_t, bool>> seen;
    for (int64_t i = 0; i < shape[0]; ++i) {
      const auto found = windows_matching(padded[i], out[i], padding);
      ASSERT_EQ(found.size(), 1u) << "sample " << i << " of " << images.sizes();
      seen.insert(found.front());
    }
    EXPECT_GT(seen.size(), 4u) << "crops and flips should vary across the batch";
  }
}

TEST(RandomCropFlip, OffsetsCoverTheWholeRangeAndBothFlips) {
  // 1x1 images with pixel 1: the output pixel at (y, x) is 1 exactly when the crop puts the
  // image there, which reveals the offsets; 3x3 outputs with padding 1 allow offsets 0..2.
  const torch::Tensor images = torch::zeros({300, 1, 3, 3}, torch::kFloat);
  images.select(2, 1).select(2, 1).fill_(1);
  at::Generator g = ddp::augmentation_generator(11, 0, 0);
  const torch::Tensor out = ddp::RandomCropFlip{1, false}(images, g);
  const torch::Tensor where = out.view({300, 9}).argmax(1);
  EXPECT_TRUE(torch::equal(out.sum({1, 2, 3}), torch::ones({300})));
  EXPECT_TRUE(torch::equal(torch::bincount(where, {}, 9).gt(0), torch::ones({9}, torch::kBool)))
      << torch::bincount(where, {}, 9);
}

TEST(RandomCropFlip, MatchesPerSampleCropThenMirror) {
  // torchvision's RandomCrop(padding) then RandomHorizontalFlip, one sample at a time, with the
  // draws the header documents: all top offsets, then all left offsets, then all flips.
  const int64_t batch = 10;
  const int64_t padding = 3;
  const torch::Tensor images = random_images(batch, 12).to(torch::kFloat);
  at::Generator g = ddp::augmentation_generator(8, 1, 4);
  const torch::Tensor out = ddp::RandomCropFlip{padding, true}(images, g);

  at::Generator replay = ddp::augmentation_generator(8, 1, 4);
  const torch::Tensor top = torch::randint(0, 2 * padding + 1, {batch, 1}, replay);
  const torch::Tensor left = torch::randint(0, 2 * padding + 1, {batch, 1}, replay);
  const torch::Tensor flips = torch::randint(0, 2, {batch, 1}, replay);
  const torch::Tensor padded = torch::constant_pad_nd(images, {padding, padding, padding, padding});
  for (int64_t i = 0; i < batch; ++i) {
    torch::Tensor expected = padded[i]
                                 .narrow(1, top[i][0].item<int64_t>(), 32)
                                 .narrow(2, left[i][0].item<int64_t>(), 32);
    if (flips[i][0].item<int64_t>() == 1) expected = expected.flip({2});
    EXPECT_TRUE(torch::equal(out[i], expected)) << "sample " << i;
  }
}

TEST(RandomCropFlip, ByteAndFloatGiveTheSameGeometry) {
  const torch::Tensor images = random_images(16, 13);
  at::Generator g8 = ddp::augmentation_generator(2, 3, 4);
  at::Generator g32 = ddp::augmentation_generator(2, 3, 4);
  const ddp::RandomCropFlip augment;
  const torch::Tensor bytes = augment(images, g8);
  const torch::Tensor floats = augment(images.to(torch::kFloat).div(255), g32);
  EXPECT_EQ(floats.dtype(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(bytes.to(torch::kFloat).div(255), floats));
}

TEST(RandomCropFlip, RejectsBadArguments) {
  at::Generator g = ddp::augmentation_generator(0, 0, 0);
  expect_error<std::invalid_argument>(
      [&] {
        ddp::RandomCropFlip{}(torch::zeros({3, 32, 32}, torch::kByte), g);
      },
      {"RandomCropFlip", "[B,C,H,W]", "3 dimensions"});
  expect_error<std::invalid_argument>(
      [&] {
        ddp::RandomCropFlip{-1, true}(torch::zeros({1, 3, 32, 32}, torch::kByte), g);
      },
      {"RandomCropFlip", "padding", "-1"});
}

TEST(RandomCropFlip, CudaMatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Tensor images = random_images(32, 14);
  at::Generator cpu_g = ddp::augmentation_generator(9, 0, 1);
  at::Generator gpu_g = ddp::augmentation_generator(9, 0, 1);
  const ddp::RandomCropFlip augment;
  const torch::Tensor on_cpu = augment(images, cpu_g);
  const torch::Tensor on_gpu = augment(images.to(torch::kCUDA), gpu_g);
  EXPECT_TRUE(on_gpu.is_cuda());
  EXPECT_TRUE(torch::equal(on_gpu.cpu(), on_cpu));
}

}  // namespace

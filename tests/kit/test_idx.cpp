#include <ddp/train/mnist.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <zlib.h>

#include <fstream>
#include <vector>

namespace {

using ddp_test::Bytes;
using ddp_test::expect_error;
using ddp_test::write_file;

Bytes idx_bytes(const std::vector<int32_t>& dims, uint8_t fill_base) {
  Bytes b{0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  int64_t count = 1;
  for (int32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<uint8_t>(d >> shift));
    count *= d;
  }
  for (int64_t i = 0; i < count; ++i) b.push_back(static_cast<uint8_t>((fill_base + i) % 10));
  return b;
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(f);
}

TEST(IdxReader, RealFashionMnist) {
  const ddp::ImageDataset train = ddp::load_mnist(ddp_test::mnist_dir(), ddp::MnistSplit::Train);
  const ddp::ImageDataset test = ddp::load_mnist(ddp_test::mnist_dir(), ddp::MnistSplit::Test);
  EXPECT_EQ(train.images.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(test.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(train.images.dtype(), torch::kByte);
  EXPECT_EQ(train.labels.dtype(), torch::kLong);
  // Fashion-MNIST is balanced: 6000 and 1000 images per class; the first is an ankle boot (9).
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels), torch::full({10}, 6000, torch::kLong)));
  EXPECT_TRUE(torch::equal(torch::bincount(test.labels), torch::full({10}, 1000, torch::kLong)));
  EXPECT_EQ(train.labels[0].item<int64_t>(), 9);
  EXPECT_GT(train.images.max().item<int>(), 200);
}

TEST(IdxReader, RawAndGzipReadTheSame) {
  const std::string dir = ddp_test::make_temp_dir("idx_same");
  const Bytes bytes = idx_bytes({3, 2, 2}, 1);
  write_file(dir + "/raw-idx3-ubyte", bytes);
  write_gz(dir + "/packed-idx3-ubyte.gz", bytes);
  const torch::Tensor raw = ddp::read_idx(dir + "/raw-idx3-ubyte");
  const torch::Tensor packed = ddp::read_idx(dir + "/packed-idx3-ubyte");  // finds the .gz
  EXPECT_EQ(raw.sizes(), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_TRUE(torch::equal(raw, packed));
  EXPECT_EQ(raw.flatten()[5].item<int>(), 6);
}

TEST(IdxReader, CorruptFilesNameTheFileAndTheFault) {
  const std::string dir = ddp_test::make_temp_dir("idx_bad");
  expect_error([&] { ddp::read_idx(dir + "/absent"); }, {dir + "/absent", "no such file"});

  Bytes magic = idx_bytes({4}, 0);
  magic[0] = 0x12;
  write_file(dir + "/magic", magic);
  expect_error([&] { ddp::read_idx(dir + "/magic"); }, {dir + "/magic", "bad magic"});

  Bytes type = idx_bytes({4}, 0);
  type[2] = 0x0D;  // float
  write_file(dir + "/type", type);
  expect_error([&] { ddp::read_idx(dir + "/type"); }, {dir + "/type", "unsigned byte"});

  Bytes truncated = idx_bytes({10, 28, 28}, 0);
  truncated.resize(truncated.size() / 2);
  write_gz(dir + "/truncated.gz", truncated);
  expect_error([&] { ddp::read_idx(dir + "/truncated"); }, {dir + "/truncated.gz", "truncated"});

  Bytes trailing = idx_bytes({4}, 0);
  trailing.push_back(0);
  write_file(dir + "/trailing", trailing);
  expect_error([&] { ddp::read_idx(dir + "/trailing"); }, {dir + "/trailing", "trailing bytes"});

  Bytes header_only = {0, 0, 8, 3, 0, 0};
  write_file(dir + "/header", header_only);
  expect_error([&] { ddp::read_idx(dir + "/header"); }, {dir + "/header", "truncated IDX header"});
}

TEST(IdxReader, LoadMnistChecksImagesAgainstLabels) {
  const std::string dir = ddp_test::make_temp_dir("idx_pair");
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", idx_bytes({5, 28, 28}, 0));
  write_gz(dir + "/t10k-labels-idx1-ubyte.gz", idx_bytes({4}, 0));
  expect_error(
      [&] { ddp::load_mnist(dir, ddp::MnistSplit::Test); },
      {"t10k-images-idx3-ubyte.gz has 5 images", "t10k-labels-idx1-ubyte.gz has 4 labels"});

  Bytes labels = idx_bytes({5}, 0);
  labels.back() = 12;
  write_gz(dir + "/t10k-labels-idx1-ubyte.gz", labels);
  expect_error([&] { ddp::load_mnist(dir, ddp::MnistSplit::Test); },
               {"t10k-labels-idx1-ubyte.gz", "label 12 outside 0..9"});

  write_gz(dir + "/t10k-labels-idx1-ubyte.gz", idx_bytes({5}, 0));
  const ddp::ImageDataset ok = ddp::load_mnist(dir, ddp::MnistSplit::Test);
  EXPECT_EQ(ok.size(), 5);
  expect_error([&] { ddp::load_mnist(dir, ddp::MnistSplit::Train); },
               {dir + "/train-images-idx3-ubyte", "no such file"});
}

TEST(ImageDataset, BatchNormalisesOnTheDevice) {
  ddp::ImageDataset data{torch::tensor({0, 255, 51}, torch::kByte).view({3, 1, 1, 1}),
                         torch::tensor({1, 2, 3}, torch::kLong),
                         {0.2},
                         {0.5}};
  const std::vector<int64_t> indices{2, 0, 1};
  const ddp::Batch b = data.batch(indices, 0, 2, torch::kCPU);
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 1, 1, 1}));
  EXPECT_NEAR(b.inputs[0].item<float>(), 0.0f, 1e-6);   // (51/255 - 0.2) / 0.5
  EXPECT_NEAR(b.inputs[1].item<float>(), -0.4f, 1e-6);  // (0 - 0.2) / 0.5
  EXPECT_TRUE(torch::equal(b.targets, torch::tensor({3, 1}, torch::kLong)));
  EXPECT_THROW(data.batch(indices, 2, 4, torch::kCPU), std::out_of_range);
}

}  // namespace

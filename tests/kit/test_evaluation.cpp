#include <ddp/train/adadelta.h>
#include <ddp/train/augment.h>
#include <ddp/train/classification.h>
#include <ddp/train/image_dataset.h>
#include <ddp/distributed_sampler.h>
#include <ddp/train/mnist.h>
#include <ddp/train/trainer.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <limits>
#include <numeric>
#include <vector>

namespace test_evaluation {

using ddp_test::small_cnn;
using ddp_test::small_images;

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

// Single-process evaluation written out plainly, with batches of a different size.
struct Alone {
  double loss = 0;
  int64_t correct = 0;
};
Alone evaluate_alone(torch::nn::Sequential& net, const ddp::ImageDataset& data) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> all(static_cast<size_t>(data.size()));
  std::iota(all.begin(), all.end(), int64_t{0});
  Alone e;
  double loss = 0;
  for (int64_t begin = 0; begin < data.size(); begin += 777) {
    const ddp::Batch b =
        data.batch(all, begin, std::min<int64_t>(data.size(), begin + 777), torch::kCPU);
    const torch::Tensor out = net->forward(b.inputs);
    loss += torch::nll_loss(out, b.targets, {}, torch::Reduction::None)
                .to(torch::kDouble)
                .sum()
                .item<double>();
    e.correct += out.argmax(1).eq(b.targets).sum().item<int64_t>();
  }
  e.loss = loss / static_cast<double>(data.size());
  return e;
}

TEST(Trainer, DistributedEvaluationEqualsSingleProcess) {
  const ddp::ImageDataset full = ddp::load_mnist(ddp_test::mnist_dir(), ddp::MnistSplit::Test);
  // 9999 samples too, so the shards are uneven at 2 and 4 ranks.
  const ddp::ImageDataset odd{full.images.slice(0, 0, 9999), full.labels.slice(0, 0, 9999),
                              full.mean, full.stddev};
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(784, 10),
                            torch::nn::LogSoftmax(1));
  ddp::DistributedDataParallel model(pg(), net.ptr());
  ddp::Adadelta optimizer(net->parameters());
  ddp::TrainerOptions options;
  options.test_batch_size = 1000;
  for (const ddp::ImageDataset* data : {&full, &odd}) {
    ddp::ClassificationTask task(*data, data,
                                 [&](const torch::Tensor& x) { return net->forward(x); });
    ddp::Trainer trainer(pg(), *net, task, optimizer, options, &model);
    const ddp::Evaluation distributed = trainer.evaluate();
    const Alone alone = evaluate_alone(net, *data);
    EXPECT_EQ(distributed.samples, data->size());
    ASSERT_EQ(distributed.metrics.size(), 1u);
    EXPECT_EQ(distributed.metrics[0].name, "accuracy");  // the count of correct predictions
    EXPECT_EQ(distributed.metrics[0].sum, static_cast<double>(alone.correct));
    EXPECT_EQ(distributed.metrics[0].samples, data->size());
    EXPECT_NEAR(distributed.loss, alone.loss, 1e-9 * alone.loss);
    EXPECT_GT(alone.correct, 0);
  }
}

// A training forward leaves each rank its own BatchNorm statistics; the evaluation scores every
// shard with rank 0's, the model rank 0 saves, as PyTorch's first forward after training does.
TEST(Trainer, EvaluationUsesRankZerosBuffers) {
  const ddp::ImageDataset full = ddp::load_mnist(ddp_test::mnist_dir(), ddp::MnistSplit::Test);
  const ddp::ImageDataset data{full.images.slice(0, 0, 2001), full.labels.slice(0, 0, 2001),
                               full.mean, full.stddev};
  torch::manual_seed(1);
  torch::nn::BatchNorm1d bn(10);
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(784, 10), bn,
                            torch::nn::LogSoftmax(1));
  ddp::DistributedDataParallel model(pg(), net.ptr());
  {
    torch::NoGradGuard no_grad;  // each rank's own statistics, as after a training step
    bn->running_mean.fill_(0.5 * rt().rank());
    bn->running_var.fill_(1.0 + rt().rank());
  }
  ddp::Adadelta optimizer(net->parameters());
  ddp::TrainerOptions options;
  options.test_batch_size = 500;
  ddp::ClassificationTask task(data, &data,
                               [&](const torch::Tensor& x) { return net->forward(x); });
  ddp::Trainer trainer(pg(), *net, task, optimizer, options, &model);
  const ddp::Evaluation distributed = trainer.evaluate();
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(bn->running_mean));
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(bn->running_var));
  EXPECT_EQ(bn->running_var[0].item<float>(), 1.0f) << "not rank 0's statistics";
  net->eval();
  const Alone alone = evaluate_alone(net, data);  // rank 0's model on the whole set
  ASSERT_EQ(distributed.metrics.size(), 1u);
  EXPECT_EQ(distributed.metrics[0].sum, static_cast<double>(alone.correct));
  EXPECT_NEAR(distributed.loss, alone.loss, 1e-9 * alone.loss);
}

TEST(Trainer, SeveralRanksWithoutDdpIsRejected) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  torch::nn::Linear net(2, 2);
  ddp::Adadelta optimizer(net->parameters());
  const ddp::ImageDataset data = small_images();
  ddp::ClassificationTask task(data, nullptr,
                               [&](const torch::Tensor& x) { return net->forward(x); });
  EXPECT_THROW(ddp::Trainer(pg(), *net, task, optimizer, ddp::TrainerOptions{}),
               std::invalid_argument);
}

// The Trainer gathers batch b+1 during step b. It must still train on exactly the batches of the
// plain loop (gather, augment, normalise, then the step), and end with the same weights.
TEST(Trainer, TrainEpochIsThePlainLoopBitForBit) {
  const ddp::ImageDataset data = small_images();
  torch::nn::Sequential net = small_cnn(), plain = small_cnn();
  ddp::DistributedDataParallel model(pg(), net.ptr()), plain_model(pg(), plain.ptr());
  auto sgd = torch::optim::SGDOptions(0.05).momentum(0.9);
  torch::optim::SGD optimizer(net->parameters(), sgd), plain_optimizer(plain->parameters(), sgd);
  ddp::TrainerOptions options;
  options.batch_size = 7;  // shards of 100, 50 and 25 samples: a short last batch
  options.report.log_interval = 0;
  options.seed = 5;
  const ddp::RandomCropFlip augment{2, true};
  std::vector<torch::Tensor> seen;
  ddp::ClassificationTask task(
      data, nullptr,
      [&](const torch::Tensor& x) {
        seen.push_back(x);
        return net->forward(x);
      },
      augment);
  ddp::Trainer trainer(pg(), *net, task, optimizer, options, &model);
  const int64_t epoch = 3;
  trainer.train_epoch(epoch);

  ddp::DistributedSampler sampler(data.size(), rt().world_size(), rt().rank(), true, options.seed);
  sampler.set_epoch(epoch);
  const std::vector<int64_t> indices = sampler.indices();
  const int64_t n = static_cast<int64_t>(indices.size());
  at::Generator generator = ddp::augmentation_generator(options.seed, rt().rank(), epoch);
  size_t steps = 0;
  for (int64_t begin = 0; begin < n; begin += options.batch_size, ++steps) {
    const ddp::Batch batch =
        data.gather(indices, begin, std::min(n, begin + options.batch_size), torch::kCPU);
    const torch::Tensor inputs = data.normalise(augment(batch.inputs, generator));
    ASSERT_LT(steps, seen.size());
    EXPECT_TRUE(torch::equal(seen[steps], inputs)) << "batch " << steps;
    plain_optimizer.zero_grad();
    plain_model.prepare_forward();
    torch::nll_loss(plain->forward(inputs), batch.targets).backward();
    plain_optimizer.step();
  }
  EXPECT_EQ(seen.size(), steps);
  const auto trained = net->named_parameters(), expected = plain->named_parameters();
  for (const auto& p : trained) {
    EXPECT_TRUE(torch::equal(p.value(), expected[p.key()])) << p.key();
  }
}

TEST(ImageDataset, GatherFromHostMemoryPicksTheIndexedRangeOnTheCpu) {
  const ddp::ImageDataset data = small_images();
  const std::vector<int64_t> indices = {99, 3, 42, 42, 0, 17};
  const ddp::Batch batch = data.gather(indices, 1, 5, torch::kCPU);
  const torch::Tensor rows = torch::tensor({3, 42, 42, 0}, torch::kLong);
  EXPECT_EQ(batch.inputs.dtype(), torch::kByte);
  EXPECT_TRUE(batch.inputs.device().is_cpu());
  EXPECT_TRUE(torch::equal(batch.inputs, data.images.index_select(0, rows)));
  EXPECT_TRUE(torch::equal(batch.targets, data.labels.index_select(0, rows)));
  EXPECT_TRUE(
      torch::equal(data.batch(indices, 1, 5, torch::kCPU).inputs, data.normalise(batch.inputs)));
  EXPECT_THROW(data.gather(indices, 4, 7, torch::kCPU), std::out_of_range);
}

TEST(ImageDataset, HostMemoryAlwaysHoldsTheDataSet) {
  const ddp::ImageDataset data = small_images();
  EXPECT_EQ(data.bytes(), 100 * 3 * 8 * 8 + 100 * 8);
  EXPECT_TRUE(ddp::fits_on(torch::kCPU, data.bytes(), rt().rank()));
  EXPECT_TRUE(ddp::fits_on(torch::kCPU, std::numeric_limits<int64_t>::max(), rt().rank()));
  EXPECT_THROW(ddp::fits_on(torch::Device(torch::kMeta), data.bytes(), rt().rank()),
               std::invalid_argument);
}

}  // namespace test_evaluation

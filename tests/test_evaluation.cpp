#include <ddp/adadelta.h>
#include <ddp/mnist.h>
#include <ddp/trainer.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <numeric>

namespace {

ddp::Runtime& rt() { return ddp_test::runtime(); }

// Single-process evaluation written out plainly, with batches of a different size.
ddp::Evaluation evaluate_alone(torch::nn::Sequential& net, const ddp::ImageDataset& data) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> all(static_cast<size_t>(data.size()));
  std::iota(all.begin(), all.end(), int64_t{0});
  ddp::Evaluation e;
  double loss = 0;
  for (int64_t begin = 0; begin < data.size(); begin += 777) {
    const ddp::Batch b = data.batch(all, begin, std::min<int64_t>(data.size(), begin + 777), torch::kCPU);
    const torch::Tensor out = net->forward(b.inputs);
    loss += torch::nll_loss(out, b.targets, {}, torch::Reduction::None).to(torch::kDouble).sum().item<double>();
    e.correct += out.argmax(1).eq(b.targets).sum().item<int64_t>();
  }
  e.total = data.size();
  e.loss = loss / static_cast<double>(data.size());
  return e;
}

TEST(Trainer, DistributedEvaluationEqualsSingleProcess) {
  const ddp::ImageDataset full = ddp::load_mnist(ddp::kDefaultMnistDir, ddp::MnistSplit::Test);
  // 9999 samples too, so the shards are uneven at 2 and 4 ranks.
  const ddp::ImageDataset odd{full.images.slice(0, 0, 9999), full.labels.slice(0, 0, 9999),
                              full.mean, full.stddev};
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(784, 10),
                            torch::nn::LogSoftmax(1));
  ddp::DistributedDataParallel model(rt(), net.ptr());
  ddp::Adadelta optimizer(net->parameters());
  ddp::TrainerOptions options;
  options.test_batch_size = 1000;
  ddp::Trainer trainer(rt(), *net, [&](const torch::Tensor& x) { return net->forward(x); },
                       optimizer, options, &model);
  for (const ddp::ImageDataset* data : {&full, &odd}) {
    const ddp::Evaluation distributed = trainer.evaluate(*data);
    const ddp::Evaluation alone = evaluate_alone(net, *data);
    EXPECT_EQ(distributed.total, data->size());
    EXPECT_EQ(distributed.correct, alone.correct);
    EXPECT_NEAR(distributed.loss, alone.loss, 1e-9 * alone.loss);
    EXPECT_GT(distributed.correct, 0);
  }
}

TEST(Trainer, SeveralRanksWithoutDdpIsRejected) {
  if (rt().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  torch::nn::Linear net(2, 2);
  ddp::Adadelta optimizer(net->parameters());
  EXPECT_THROW(ddp::Trainer(rt(), *net, [&](const torch::Tensor& x) { return net->forward(x); },
                            optimizer, ddp::TrainerOptions{}),
               std::invalid_argument);
}

}  // namespace

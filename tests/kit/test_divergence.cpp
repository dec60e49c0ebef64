// Training that diverges (divergence.h, issue 26), at 1, 2 and 4 ranks: a NaN loss on one rank
// makes every rank's averaged gradients NaN, and every rank stops before that step
// (TrainingDiverged naming it) or drops it (OnNonFinite::Skip: the parameters are those of the
// step before, the epoch's sums leave the step out) up to max_skipped_steps in a row; an
// infinite loss whose gradients are finite (loss + inf) is agreed at the next stop check and
// stops; the Checkpointer refuses to write (or rotate good files out for) a model that is not
// finite; the gradient check reads only.
#include <ddp/train/checkpointer.h>
#include <ddp/train/divergence.h>
#include <ddp/train/task.h>
#include <ddp/train/trainer.h>

#include "after_step_hook.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <limits>

namespace test_divergence {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

constexpr int64_t kSamples = 96;  // 12 micro-batches of 4 per rank at 2 ranks
constexpr int64_t kBatch = 4;

struct Batch {
  torch::Tensor x, y;
};

// y = <w, x>: a linear regression. On the last rank, the loss of micro-batch `poison_from` (and
// of every later one with `poison_all`) is changed by `poison`: times NaN (the gradients become
// NaN) or plus inf (the loss is infinite, the gradients stay finite).
class Poisoned : public ddp::Task<Batch> {
 public:
  Poisoned(torch::nn::Linear net, int64_t poison_from, bool poison_all, double poison_add)
      : net_(std::move(net)), from_(poison_from), all_(poison_all), add_(poison_add) {
    torch::manual_seed(5);
    x_ = torch::randn({kSamples, 3});
    y_ = (x_ * torch::tensor({0.5, -1.0, 2.0})).sum(1, true);
  }
  int64_t train_size() const override { return kSamples; }
  Batch train_batch(const std::vector<int64_t>& indices, torch::Device) override {
    const torch::Tensor i = torch::tensor(indices, torch::kLong);
    return Batch{x_.index_select(0, i), y_.index_select(0, i)};
  }
  ddp::StepOutput loss(Batch& batch) override {
    ddp::StepOutput out;
    out.loss = torch::mse_loss(net_->forward(batch.x), batch.y);
    out.samples = batch.y.size(0);
    const int64_t call = calls_++;
    if (rt().rank() == rt().world_size() - 1 && (call == from_ || (all_ && call > from_))) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      out.loss = std::isnan(add_) ? out.loss * nan : out.loss + add_;
    }
    return out;
  }

 private:
  torch::nn::Linear net_;
  torch::Tensor x_, y_;
  int64_t calls_ = 0, from_;
  bool all_;
  double add_;
};

torch::nn::Linear make_net() {
  torch::manual_seed(3);
  return torch::nn::Linear(3, 1);
}

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten().clone());
  return torch::cat(parts);
}

ddp::TrainerOptions options() {
  ddp::TrainerOptions o;
  o.batch_size = kBatch;
  o.report.log_interval = 0;
  o.report.progress = ddp::ProgressMode::None;
  return o;
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

TEST(Divergence, NanGradientsStopEveryRankBeforeTheStep) {
  torch::nn::Linear net = make_net();
  ddp::DistributedDataParallel model(pg(), net.ptr());
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
  Poisoned task(net, /*poison_from=*/4, false, kNaN);  // micro-batch 4: step 5
  torch::Tensor after_step_4;
  ddp::TrainerOptions o = options();
  ddp_test::AfterStep hook([&](int64_t step, int) {
    if (step == 4) after_step_4 = flat(*net);
  });
  ddp::Trainer trainer(pg(), *net, task, optimizer, o, &model);
  try {
    trainer.fit(2);
    FAIL() << "no TrainingDiverged";
  } catch (const ddp::TrainingDiverged& e) {
    EXPECT_EQ(e.step(), 5);
    EXPECT_EQ(e.epoch(), 1);
    EXPECT_NE(std::string(e.what()).find("Training diverged at step 5 (epoch 1): the gradients are "
                                         "not finite (largest |gradient| nan), learning rate 0.05"),
              std::string::npos)
        << e.what();
  }
  // Stopped before the step: the parameters are step 4's, finite, the same on every rank.
  EXPECT_TRUE(torch::equal(flat(*net), after_step_4));
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(flat(*net)));
}

TEST(Divergence, SkipDropsTheStepAndItsSumsThenStopsAfterTheLimitInARow) {
  {
    torch::nn::Linear net = make_net();
    ddp::DistributedDataParallel model(pg(), net.ptr());
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
    Poisoned task(net, 4, false, kNaN);
    std::vector<torch::Tensor> after;  // after[s]: the parameters after step s
    ddp::TrainerOptions o = options();
    o.on_nonfinite = ddp::OnNonFinite::Skip;
    ddp_test::AfterStep hook([&](int64_t, int) { after.push_back(flat(*net)); });
    ddp::Trainer trainer(pg(), *net, task, optimizer, o, &model);
    const std::vector<ddp::EpochResult> results = trainer.fit(1);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(trainer.skipped_steps(), 1);
    ASSERT_GE(after.size(), 6u);
    EXPECT_TRUE(torch::equal(after[4], after[3])) << "step 5 was dropped";
    EXPECT_FALSE(torch::equal(after[5], after[4])) << "step 6 was taken";
    EXPECT_TRUE(std::isfinite(results[0].train_loss));
    EXPECT_EQ(results[0].samples, kSamples - kBatch * rt().world_size()) << "step 5's batches";
    EXPECT_TRUE(torch::isfinite(flat(*net)).all().item<bool>());
    EXPECT_TRUE(ddp_test::identical_on_all_ranks(flat(*net)));
  }
  {
    torch::nn::Linear net = make_net();
    ddp::DistributedDataParallel model(pg(), net.ptr());
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
    Poisoned task(net, 4, /*poison_all=*/true, kNaN);  // steps 5, 6, 7, ...
    ddp::TrainerOptions o = options();
    o.on_nonfinite = ddp::OnNonFinite::Skip;
    o.max_skipped_steps = 2;
    ddp::Trainer trainer(pg(), *net, task, optimizer, o, &model);
    try {
      trainer.fit(2);  // at 4 ranks an epoch has 6 steps: step 7 is in epoch 2
      FAIL() << "no TrainingDiverged";
    } catch (const ddp::TrainingDiverged& e) {
      EXPECT_EQ(e.step(), 7);
      EXPECT_NE(std::string(e.what()).find("after 2 dropped step(s) in a row"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(trainer.skipped_steps(), 2);
    EXPECT_TRUE(torch::isfinite(flat(*net)).all().item<bool>());
  }
}

TEST(Divergence, InfiniteLossWithFiniteGradientsStopsAtTheNextCheck) {
  torch::nn::Linear net = make_net();
  ddp::DistributedDataParallel model(pg(), net.ptr());
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
  Poisoned task(net, 4, false, kInf);  // loss + inf: its gradients are the finite loss's
  ddp::TrainerOptions o = options();
  o.on_nonfinite = ddp::OnNonFinite::Skip;  // a loss stops in either mode
  int64_t last_step = 0;
  ddp_test::AfterStep hook([&](int64_t step, int) { last_step = step; });
  ddp::Trainer trainer(pg(), *net, task, optimizer, o, &model);
  try {
    trainer.fit(1);
    FAIL() << "no TrainingDiverged";
  } catch (const ddp::TrainingDiverged& e) {
    EXPECT_EQ(e.step(), 5);
    EXPECT_NE(
        std::string(e.what()).find("the loss of rank " + std::to_string(rt().world_size() - 1) +
                                   " was not finite (first at step 5)"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(last_step, 6) << "sent at the boundary after step 5, read at the one after step 6 "
                             "(at 4 ranks, the epoch's end)";
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(flat(*net)));
}

TEST(Divergence, TheGradientCheckOnlyReads) {
  torch::nn::Linear net = make_net();
  torch::mse_loss(net->forward(torch::ones({2, 3})), torch::zeros({2, 1})).backward();
  std::vector<torch::Tensor> before;
  for (const auto& p : net->parameters()) before.push_back(p.grad().clone());
  const double largest = ddp::largest_abs_gradient(net->parameters());
  double expected = 0;
  for (const auto& g : before) expected = std::max(expected, g.abs().max().item<double>());
  EXPECT_EQ(largest, expected);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(net->parameters()[i].grad(), before[i]));
  }
  // The largest magnitude a negative value: |min|, not max.
  net->weight.mutable_grad()[0][1] = -1024.0;  // larger than any of this net's gradients
  EXPECT_EQ(ddp::largest_abs_gradient(net->parameters()), 1024.0);
  net->bias.mutable_grad()[0] = kNaN;
  EXPECT_TRUE(std::isnan(ddp::largest_abs_gradient(net->parameters())));
  net->bias.mutable_grad()[0] = -kInf;
  EXPECT_TRUE(std::isinf(ddp::largest_abs_gradient(net->parameters())));
  EXPECT_EQ(ddp::parse_on_nonfinite("skip"), ddp::OnNonFinite::Skip);
  EXPECT_THROW(ddp::parse_on_nonfinite("ignore"), std::invalid_argument);
}

TEST(Divergence, CheckpointerNeverWritesNorRotatesForANonFiniteModel) {
  torch::nn::Linear net = make_net();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
  const std::string dir = ddp::all_gather_strings(
      pg().cpu(),
      rt().is_main() ? ddp_test::make_temp_dir("divergence_checkpoints") : std::string())[0];
  ddp::CheckpointerOptions o;
  o.dir = dir;
  o.keep = 1;  // epoch 2's files would rotate epoch 1's out
  ddp::Checkpointer checkpointer(pg(), *net, optimizer, o);
  checkpointer.save_epoch(1, 10);
  {
    torch::NoGradGuard no_grad;
    net->weight[0][1] = kNaN;
  }
  try {
    checkpointer.save_epoch(2, 20);
    FAIL() << "wrote a NaN model";
  } catch (const ddp::TrainingDiverged& e) {
    EXPECT_NE(std::string(e.what()).find("refusing to write " + dir +
                                         "/model_with_epoch2.pt at step 20: the model's weight is "
                                         "not finite"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(checkpointer.save_step({3, 2, 22}, {}), ddp::TrainingDiverged);
  if (rt().is_main()) {
    namespace fs = std::filesystem;
    EXPECT_TRUE(fs::exists(dir + "/model_with_epoch1.pt"));
    EXPECT_TRUE(fs::exists(dir + "/snapshot_epoch1.pt"));
    EXPECT_FALSE(fs::exists(dir + "/model_with_epoch2.pt"));
    EXPECT_FALSE(fs::exists(dir + "/snapshot_epoch2.pt"));
    EXPECT_FALSE(fs::exists(dir + "/snapshot_epoch3_batch2.pt"));
  }
}

}  // namespace test_divergence

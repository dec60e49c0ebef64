// The Trainer's training-step options (issue 13): accumulation, clipping, autocast and a per-step
// schedule give exactly the hand-written loop of docs/training_loop.md; the schedule's position
// and the loss scaler's state survive a snapshot, and a snapshot that lacks one the run uses is
// refused naming it.
#include <ddp/train/image_dataset.h>
#include <ddp/distributed_sampler.h>
#include <ddp/train/adadelta.h>
#include <ddp/train/autocast.h>
#include <ddp/train/classification.h>
#include <ddp/train/grad_clip.h>
#include <ddp/train/lr_schedule.h>
#include <ddp/train/snapshot.h>
#include <ddp/train/trainer.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <optional>

namespace test_trainer_step {

using ddp_test::small_cnn;
using ddp_test::small_images;

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

ddp::LRScheduleOptions warmup_cosine() {
  ddp::LRScheduleOptions s;
  s.warmup_steps = 2;
  s.decay = ddp::LRDecay::Cosine;
  s.decay_steps = 4;
  return s;
}

// Also with the Trainer's gradients as views into the buckets (it then zeroes them in place; the
// loop resets them and copies): bit-identical still.
class TrainerStepViews : public testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(GradientAsBucketView, TrainerStepViews, testing::Bool());

TEST_P(TrainerStepViews, AccumulationClippingBf16AndScheduleAreTheHandWrittenLoop) {
  const ddp::ImageDataset data = small_images();
  torch::nn::Sequential net = small_cnn(), plain = small_cnn();
  ddp::DDPOptions views;
  views.gradient_as_bucket_view = GetParam();
  views.reducer_at_one_rank = GetParam();
  ddp::DistributedDataParallel model(pg(), net.ptr(), views), plain_model(pg(), plain.ptr());
  auto sgd = torch::optim::SGDOptions(0.05).momentum(0.9);
  torch::optim::SGD optimizer(net->parameters(), sgd), plain_optimizer(plain->parameters(), sgd);
  ddp::LRSchedule schedule(optimizer, warmup_cosine()),
      plain_schedule(plain_optimizer, warmup_cosine());
  ddp::TrainerOptions options;
  options.batch_size = 4;  // shards of 100, 50 and 25 samples: 25, 13, 7 micro-batches
  options.report.log_interval = 0;
  options.seed = 5;
  options.accumulate = 3;  // the last group of an epoch is shorter
  options.clip_grad_norm = 0.1;
  options.amp = ddp::AmpMode::Bf16;
  options.lr_schedule = &schedule;
  ddp::ClassificationTask task(data, nullptr,
                               [&](const torch::Tensor& x) { return net->forward(x); });
  ddp::Trainer trainer(pg(), *net, task, optimizer, options, &model);
  const int64_t epoch = 2;
  trainer.train_epoch(epoch);

  ddp::DistributedSampler sampler(data.size(), rt().world_size(), rt().rank(), true, options.seed);
  sampler.set_epoch(epoch);
  const std::vector<int64_t> indices = sampler.indices();
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t batches = (n + options.batch_size - 1) / options.batch_size;
  int64_t steps = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const bool first = b % options.accumulate == 0;
    const bool last = (b + 1) % options.accumulate == 0 || b + 1 == batches;
    const int64_t begin = b * options.batch_size;
    const ddp::Batch batch =
        data.gather(indices, begin, std::min(n, begin + options.batch_size), torch::kCPU);
    const torch::Tensor inputs = data.normalise(batch.inputs);
    if (first) plain_optimizer.zero_grad();
    // The module is run directly after the pre-forward work, as the Trainer does with its
    // Forward function.
    plain_model.prepare_forward();
    torch::Tensor loss;
    {
      ddp::Autocast autocast(torch::kCPU, torch::kBFloat16);
      loss = torch::nll_loss(plain->forward(inputs), batch.targets);
    }
    {
      std::optional<ddp::DistributedDataParallel::NoSync> no_sync;
      if (!last) no_sync.emplace(plain_model);
      (loss / 3.0).backward();
    }
    if (last) {
      ddp::clip_grad_norm(plain->parameters(), 0.1);
      plain_optimizer.step();
      plain_schedule.step();
      ++steps;
    }
  }
  EXPECT_EQ(trainer.global_step(), steps);
  EXPECT_EQ(schedule.position(), steps);
  const auto trained = net->named_parameters(), expected = plain->named_parameters();
  for (const auto& p : trained) {
    EXPECT_TRUE(torch::equal(p.value(), expected[p.key()])) << p.key();
  }
  EXPECT_EQ(optimizer.param_groups()[0].options().get_lr(),
            plain_optimizer.param_groups()[0].options().get_lr());
}

TEST(TrainerStep, SnapshotsKeepTheScheduleAndTheScalerAndRefuseMissingOnes) {
  const ddp::ImageDataset data = small_images();
  const std::string dir =
      ddp_test::make_temp_dir("trainer_step_np" + std::to_string(rt().world_size()));
  torch::nn::Sequential net = small_cnn();
  ddp::DistributedDataParallel model(pg(), net.ptr());
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
  ddp::LRSchedule schedule(optimizer, warmup_cosine());
  ddp::TrainerOptions options;
  options.batch_size = 10;
  options.report.log_interval = 0;
  options.checkpoint.dir = dir;
  options.lr_schedule = &schedule;
  options.amp = ddp::AmpMode::Fp16;  // the scaler; fp16 autocast on the CPU where LibTorch has it
  options.grad_scaler.init_scale = 1024;
  options.grad_scaler.growth_interval = 1;  // grows every clean step: a state worth restoring
  double scale_before = 0;
  {
    ddp::ClassificationTask task(data, &data,
                                 [&](const torch::Tensor& x) { return net->forward(x); });
    ddp::Trainer trainer(pg(), *net, task, optimizer, options, &model);
    trainer.fit(1);
    ASSERT_NE(trainer.grad_scaler(), nullptr);
    scale_before = trainer.grad_scaler()->get_scale();
    EXPECT_NE(scale_before, 1024.0) << "the scaler never changed: nothing to restore";
  }
  const double scale_after = [&] {
    torch::nn::Sequential again = small_cnn();
    ddp::DistributedDataParallel again_model(pg(), again.ptr());
    torch::optim::SGD again_opt(again->parameters(), torch::optim::SGDOptions(0.05));
    ddp::LRSchedule again_schedule(again_opt, warmup_cosine());
    ddp::TrainerOptions resumed = options;
    resumed.lr_schedule = &again_schedule;
    resumed.checkpoint.resume = "latest";
    ddp::ClassificationTask task(data, &data,
                                 [&](const torch::Tensor& x) { return again->forward(x); });
    ddp::Trainer trainer(pg(), *again, task, again_opt, resumed, &again_model);
    trainer.fit(1);  // nothing left to train: only the resume
    EXPECT_EQ(again_schedule.position(), schedule.position());
    EXPECT_EQ(again_opt.param_groups()[0].options().get_lr(),
              optimizer.param_groups()[0].options().get_lr());
    return trainer.grad_scaler()->get_scale();
  }();
  EXPECT_EQ(scale_after, scale_before) << "the scaler's scale was not restored";

  // A run without the schedule (or without the scaler) refuses the snapshot, naming what.
  for (bool drop_schedule : {true, false}) {
    torch::nn::Sequential other = small_cnn();
    ddp::DistributedDataParallel other_model(pg(), other.ptr());
    torch::optim::SGD other_opt(other->parameters(), torch::optim::SGDOptions(0.05));
    ddp::LRSchedule other_schedule(other_opt, warmup_cosine());
    ddp::TrainerOptions o2 = options;
    o2.checkpoint.resume = "latest";
    o2.lr_schedule = drop_schedule ? nullptr : &other_schedule;
    o2.amp = drop_schedule ? ddp::AmpMode::Fp16 : ddp::AmpMode::Off;
    ddp::ClassificationTask task(data, &data,
                                 [&](const torch::Tensor& x) { return other->forward(x); });
    ddp::Trainer trainer(pg(), *other, task, other_opt, o2, &other_model);
    try {
      trainer.fit(1);
      FAIL() << "resumed without " << (drop_schedule ? "the schedule" : "the scaler");
    } catch (const std::runtime_error& e) {
      const std::string want =
          drop_schedule
              ? "per-step learning-rate schedule (LRSchedule), which this run does not use"
              : "loss scaler (GradScaler, fp16 mixed precision), which this run does not use";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// The optimizer stepped inside backward (hook_then_optimizer on the wrapper): the same epoch
// (accumulation of 2, a per-step schedule, the seed's Adadelta) ends bit-identical to the
// Trainer's usual step after it; and the Trainer refuses what needs every gradient first.
TEST(TrainerStep, OverlappedOptimizerStepIsTheSameEpoch) {
  const ddp::ImageDataset data = small_images();
  ddp::DDPOptions one_rank_too;
  one_rank_too.reducer_at_one_rank = true;
  auto run = [&](bool overlap, torch::nn::Sequential& net) {
    ddp::DistributedDataParallel model(pg(), net.ptr(), one_rank_too);
    ddp::Adadelta optimizer(net->parameters(), ddp::AdadeltaOptions(0.5));
    if (overlap)
      model.register_comm_hook(ddp::hook_then_optimizer(ddp::allreduce_hook(), optimizer));
    ddp::LRSchedule schedule(optimizer, warmup_cosine());
    ddp::TrainerOptions options;
    options.batch_size = 4;
    options.report.log_interval = 0;
    options.seed = 5;
    options.accumulate = 2;
    options.lr_schedule = &schedule;
    ddp::ClassificationTask task(data, nullptr,
                                 [&](const torch::Tensor& x) { return net->forward(x); });
    ddp::Trainer trainer(pg(), *net, task, optimizer, options, &model);
    EXPECT_EQ(trainer.optimizer_step_overlapped(), overlap);
    trainer.train_epoch(1);
    return trainer.global_step();
  };
  torch::nn::Sequential plain = small_cnn(), overlapped = small_cnn();
  const int64_t steps = run(false, plain);
  EXPECT_EQ(run(true, overlapped), steps);
  const auto expected = plain->named_parameters();
  for (const auto& p : overlapped->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), expected[p.key()])) << p.key();
  }
  EXPECT_FALSE(torch::equal(plain->parameters()[0], small_cnn()->parameters()[0]))
      << "nothing trained";
}

TEST(TrainerStep, BackwardSteppingTheOptimizerRefusesWhatNeedsEveryGradient) {
  const ddp::ImageDataset data = small_images();
  torch::nn::Sequential net = small_cnn();
  ddp::DDPOptions one_rank_too;
  one_rank_too.reducer_at_one_rank = true;
  ddp::DistributedDataParallel model(pg(), net.ptr(), one_rank_too);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  model.register_comm_hook(ddp::hook_then_optimizer(ddp::allreduce_hook(), optimizer));
  ddp::ClassificationTask task(data, nullptr,
                               [&](const torch::Tensor& x) { return net->forward(x); });
  auto refusal = [&](auto change, torch::optim::Optimizer& stepped) -> std::string {
    ddp::TrainerOptions options;
    options.report.log_interval = 0;
    change(options);
    try {
      ddp::Trainer trainer(pg(), *net, task, stepped, options, &model);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  const std::string tail =
      " needs every gradient before the optimizer step, but backward steps it "
      "bucket by bucket (the comm hook hook_then_optimizer): register the "
      "inner hook alone, or drop the option";
  EXPECT_EQ(refusal([](ddp::TrainerOptions& o) { o.clip_grad_norm = 1.0; }, optimizer),
            "TrainerOptions::clip_grad_norm" + tail);
  EXPECT_EQ(refusal([](ddp::TrainerOptions& o) { o.amp = ddp::AmpMode::Fp16; }, optimizer),
            "TrainerOptions::amp Fp16 (the GradScaler's unscale and inf check)" + tail);
  EXPECT_EQ(
      refusal([](ddp::TrainerOptions& o) { o.on_nonfinite = ddp::OnNonFinite::Skip; }, optimizer),
      "TrainerOptions::on_nonfinite Skip" + tail);
  torch::optim::SGD another(net->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_NE(refusal([](ddp::TrainerOptions&) {}, another).find("steps another optimizer"),
            std::string::npos);
  EXPECT_EQ(refusal([](ddp::TrainerOptions&) {}, optimizer), "accepted");
}

}  // namespace test_trainer_step

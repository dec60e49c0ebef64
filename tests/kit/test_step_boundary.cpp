// The step boundary (step_boundary.h) with a checkpoint of more than one model (issue 39): a
// GAN-shaped loop, a generator and a discriminator with an optimizer each, each rank drawing its
// own noise from a generator of its own (kept in the snapshots as RankState) and averaging the
// gradients over the ranks. Stopped by a signal on one rank inside the second epoch and resumed
// by fresh models, it ends bit-identical to the uninterrupted run; the two-model snapshot is
// refused by a one-model run, naming the difference. A loop's first epoch is the sampler's 1.
#include <ddp/distributed_sampler.h>
#include <ddp/train/checkpointer.h>
#include <ddp/train/step_boundary.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace test_step_boundary {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

std::string shared_dir(const std::string& name) {
  return ddp::all_gather_strings(pg().cpu(),
                                 rt().is_main() ? ddp_test::make_temp_dir(name) : "")[0];
}

constexpr int64_t kSamples = 48, kBatch = 3, kEpochs = 2;

// The GAN's two models, and what the loop holds.
struct Gan {
  torch::nn::Sequential generator{torch::nn::Linear(2, 8), torch::nn::Tanh(),
                                  torch::nn::Linear(8, 4)};
  torch::nn::Sequential discriminator{torch::nn::Linear(4, 8), torch::nn::ReLU(),
                                      torch::nn::Linear(8, 1)};
  torch::optim::Adam generator_optimizer{generator->parameters(), torch::optim::AdamOptions(0.01)};
  torch::optim::SGD discriminator_optimizer{discriminator->parameters(),
                                            torch::optim::SGDOptions(0.05).momentum(0.9)};

  ddp::SnapshotParts parts() {
    return {{{"generator", generator.ptr().get()}, {"discriminator", discriminator.ptr().get()}},
            {{"generator", &generator_optimizer}, {"discriminator", &discriminator_optimizer}}};
  }
  torch::Tensor weights() const {
    std::vector<torch::Tensor> all;
    for (const auto& p : generator->parameters()) all.push_back(p.detach().flatten());
    for (const auto& p : discriminator->parameters()) all.push_back(p.detach().flatten());
    return torch::cat(all);
  }
};

// The gradients averaged over the ranks, as DistributedDataParallel's backward leaves them.
void average_gradients(torch::nn::Module& module) {
  for (auto& p : module.parameters()) {
    if (!p.grad().defined()) continue;
    pg().cpu().all_reduce(p.mutable_grad());
    p.mutable_grad().div_(rt().world_size());
  }
}

// One step on the real samples `real`: the discriminator, then the generator, on this rank's noise.
void gan_step(Gan& gan, const torch::Tensor& real, at::Generator& noise) {
  const torch::Tensor z = torch::randn({real.size(0), 2}, noise);
  gan.discriminator_optimizer.zero_grad();
  const torch::Tensor fake = gan.generator->forward(z);
  const torch::Tensor d_loss = torch::softplus(-gan.discriminator->forward(real)).mean() +
                               torch::softplus(gan.discriminator->forward(fake.detach())).mean();
  d_loss.backward();
  average_gradients(*gan.discriminator);
  gan.discriminator_optimizer.step();
  gan.generator_optimizer.zero_grad();
  torch::softplus(-gan.discriminator->forward(fake)).mean().backward();
  average_gradients(*gan.generator);
  gan.generator_optimizer.step();
}

// Trains to the end of kEpochs, or until the ranks stop (rank 1, or 0 alone, raises SIGUSR2 after
// step `signal_after`; -1: never). Returns whether it stopped.
bool train(Gan& gan, const std::string& dir, bool resume, int64_t signal_after) {
  ddp::CheckpointerOptions options;
  options.dir = dir;
  options.resume = resume ? "latest" : "";
  options.seed = 4;
  options.batch_size = kBatch;
  ddp::StepBoundary boundary(pg(), ddp::Checkpointer(pg(), gan.parts(), options));
  const ddp::ResumePoint& resumed = boundary.resume();
  const torch::Tensor data =
      torch::randn({kSamples, 4}, at::make_generator<at::CPUGeneratorImpl>(11)) + 2;
  ddp::DistributedSampler sampler(kSamples, rt().world_size(), rt().rank(), /*shuffle=*/true,
                                  options.seed);
  int64_t step = resumed.position.step;
  for (int64_t epoch = resumed.position.epoch; epoch <= kEpochs; ++epoch) {
    const ddp::EpochStart start = boundary.start_epoch(epoch, sampler, kBatch);
    at::Generator noise = at::make_generator<at::CPUGeneratorImpl>(1000 * epoch + rt().rank());
    if (start.rank_state.generator.defined()) noise.set_state(start.rank_state.generator);
    const std::vector<int64_t> order = sampler.indices();
    for (int64_t b = start.first_batch; b < start.batches(sampler, kBatch); ++b) {
      if (boundary.at_step(b, step, [&] { return ddp::RankState{noise.get_state(), {}}; }))
        return true;
      const int64_t first = start.sampler_batch(b) * kBatch;
      const std::vector<int64_t> rows(
          order.begin() + first, order.begin() + std::min<int64_t>(first + kBatch, order.size()));
      gan_step(gan, data.index_select(0, torch::tensor(rows)), noise);
      ++step;
      if (step == signal_after && rt().rank() == std::min(1, rt().world_size() - 1))
        std::raise(SIGUSR2);
    }
    boundary.end_epoch();
    boundary.checkpointer().save_epoch(epoch, step);
  }
  return false;
}

int64_t batches_per_epoch() { return (kSamples / rt().world_size() + kBatch - 1) / kBatch; }

// The uninterrupted run's weights, trained once per process (every rank makes the same calls).
const torch::Tensor& full_weights() {
  static const torch::Tensor weights = [] {
    torch::manual_seed(3);
    Gan full;
    EXPECT_FALSE(train(full, shared_dir("step_boundary_full"), false, -1));
    return full.weights();
  }();
  return weights;
}

// A run into `dir` stopped by a signal after step `signal_after`; returns the snapshots written
// (rank 0's list; empty on the others).
std::vector<std::string> stop_after(const std::string& dir, int64_t signal_after) {
  const torch::Tensor& full = full_weights();
  torch::manual_seed(3);
  Gan stopped;
  EXPECT_TRUE(train(stopped, dir, false, signal_after));
  ddp::clear_stop_signal();
  EXPECT_FALSE(torch::equal(stopped.weights(), full));
  return rt().is_main() ? ddp::list_snapshots(dir) : std::vector<std::string>();
}

// Fresh models with other initial weights resumed from `dir`: the uninterrupted run's weights.
void expect_exact_resume(const std::string& dir) {
  torch::manual_seed(77);  // everything comes from the snapshot
  Gan resumed;
  EXPECT_FALSE(train(resumed, dir, true, -1));
  EXPECT_TRUE(torch::equal(resumed.weights(), full_weights()));
}

TEST(StepBoundary, TwoModelsAndTwoOptimizersStoppedInsideAnEpochResumeBitIdentical) {
  const std::string dir = shared_dir("step_boundary_stopped");
  const std::vector<std::string> written = stop_after(dir, batches_per_epoch() + 1);
  if (rt().is_main()) {  // read after batch 2 of epoch 2
    EXPECT_EQ(written, (std::vector<std::string>{ddp::snapshot_path(dir, 2, 2),
                                                 ddp::snapshot_path(dir, 1)}));
  }
  expect_exact_resume(dir);
  for (const char* name : {"generator", "discriminator"}) {
    if (rt().is_main()) {
      EXPECT_TRUE(std::filesystem::exists(dir + "/" + name + "_with_epoch2.pt"));
    }
  }

  // A one-model run does not take the two-model snapshot; nothing of it is modified.
  torch::nn::Linear one(4, 1);
  torch::optim::SGD sgd(one->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor before = one->weight.detach().clone();
  try {
    ddp::load_snapshot(ddp::snapshot_path(dir, 2), pg().cpu(), ddp_test::one_model(*one, sgd),
                       nullptr);
    FAIL() << "a one-model run loaded a two-model snapshot";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "written for a different model: the model has parameter 'weight' Float [1, 4], "
                  "the snapshot generator: parameter '0.weight' Float [8, 2]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(torch::equal(one->weight, before));
}

// A signal in an epoch's last step is agreed at the epoch's end (end_epoch), so the ranks stop
// before the next epoch's first batch, not a step into it; the resume is still bit-identical.
TEST(StepBoundary, AStopInAnEpochsLastStepLandsBeforeTheNextEpoch) {
  const std::string dir = shared_dir("step_boundary_end_stopped");
  const std::vector<std::string> written = stop_after(dir, batches_per_epoch());
  if (rt().is_main()) {
    EXPECT_NE(std::find(written.begin(), written.end(), ddp::snapshot_path(dir, 2, 0)),
              written.end());
    EXPECT_EQ(std::find(written.begin(), written.end(), ddp::snapshot_path(dir, 2, 1)),
              written.end());
  }
  expect_exact_resume(dir);
}

TEST(StepBoundary, PartNamesAreChecked) {
  torch::nn::Linear a(2, 2), b(2, 2);
  torch::optim::SGD sgd(a->parameters(), torch::optim::SGDOptions(0.1));
  auto message = [&](ddp::SnapshotParts parts) {
    try {
      ddp::check_snapshot_parts(parts, "Checkpointer");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({{{"", a.ptr().get()}}, {{"", &sgd}}}), "");
  EXPECT_EQ(message({{{"g", a.ptr().get()}, {"g", b.ptr().get()}}, {{"g", &sgd}}}),
            "Checkpointer: the module name \"g\" must be unique (\"\" only for one model with one "
            "optimizer)");
  EXPECT_EQ(
      message({{{"g", a.ptr().get()}, {"", b.ptr().get()}}, {{"g", &sgd}}}),
      "Checkpointer: the module name \"\" must be made of letters, digits and '_' (\"\" only for "
      "one model with one optimizer)");
  EXPECT_EQ(message({{}, {{"g", &sgd}}}), "Checkpointer: no module");
}

// Epochs count from 1: a loop's first epoch is the sampler's set_epoch(1), the order a PyTorch
// loop `for epoch in range(n): sampler.set_epoch(epoch)` draws second (docs/porting.md says so).
TEST(StepBoundary, TheFirstEpochIsTheSamplersEpoch1) {
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  ddp::StepBoundary boundary(pg(), ddp::Checkpointer(pg(), *net, sgd, {}));
  const ddp::ResumePoint& resumed = boundary.resume();
  ASSERT_EQ(resumed.position.epoch, 1);
  ddp::DistributedSampler sampler(kSamples, rt().world_size(), rt().rank(), true, 5);
  boundary.start_epoch(resumed.position.epoch, sampler, kBatch);
  EXPECT_EQ(sampler.epoch(), 1);
  ddp::DistributedSampler pytorch_first(kSamples, rt().world_size(), rt().rank(), true, 5);
  pytorch_first.set_epoch(0);
  EXPECT_NE(sampler.indices(), pytorch_first.indices());
  pytorch_first.set_epoch(1);
  EXPECT_EQ(sampler.indices(), pytorch_first.indices());
}

}  // namespace test_step_boundary

// A resume is exact whatever the run uses (issue 38): a run stopped by SIGTERM inside an epoch and
// resumed from the snapshot the stop wrote ends bit-identical to the uninterrupted run, with each
// comm hook (allreduce, fp16, bf16, PowerSGD: its error feedback, matrices, step count and random
// generator are in the snapshot; PowerSGD composed with the optimizer step inside backward) and
// with ZeroRedundancyOptimizer over SGD, Adam and ddp::Adadelta
// (every shard's state is consolidated into the snapshot). A state the library cannot save is
// refused on every rank, naming it; a resume with other settings names each difference.
#include <ddp/comm_hook.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/stop_signal.h>
#include <ddp/train/adadelta.h>
#include <ddp/train/lr_schedule.h>
#include <ddp/train/lr_scheduler.h>
#include <ddp/train/snapshot.h>
#include <ddp/train/task.h>
#include <ddp/train/trainer.h>
#include <ddp/zero_redundancy_optimizer.h>

#include "after_step_hook.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace test_resume_exact {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

constexpr int64_t kSamples = 64;
constexpr int64_t kBatch = 4;
constexpr int64_t kEpochs = 2;
// Inside epoch 1 at 1 and 2 ranks, epoch 2 at 4; the signal (a step before) not in an epoch's last
// step, where the stop would land at the epoch's end (StepBoundary::end_epoch).
constexpr int64_t kStopAfterStep = 6;

struct Batch {
  torch::Tensor x, y;
};

struct Data {
  torch::Tensor x, y;
  Data() {
    torch::manual_seed(5);
    x = torch::randn({kSamples, 6});
    y = torch::randn({kSamples, 3});
  }
};

// A 6 -> 16 -> 8 -> 3 MLP whose layers are registered last-first: reverse registration order is
// then not the order backward produces the gradients, so the first step rebuilds the buckets in
// another order (which a resume must restore: PowerSGD's matrices are laid out in bucket order).
// Its 16x6, 8x16 and 3x8 weights are all compressed by PowerSGD at rank 1, its biases are not.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    torch::manual_seed(1);
    c = register_module("c", torch::nn::Linear(8, 3));
    b = register_module("b", torch::nn::Linear(16, 8));
    a = register_module("a", torch::nn::Linear(6, 16));
  }
  torch::Tensor forward(torch::Tensor x) { return c(torch::tanh(b(torch::tanh(a(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(Mlp);

// MSE regression of the Mlp.
class Regression : public ddp::Task<Batch> {
 public:
  Regression(Mlp net, const Data& data) : net_(std::move(net)), data_(data) {}
  int64_t train_size() const override { return kSamples; }
  int64_t test_size() const override { return 0; }
  Batch train_batch(const std::vector<int64_t>& indices, torch::Device device) override {
    const torch::Tensor i = torch::tensor(indices, torch::kLong);
    return Batch{data_.x.index_select(0, i).to(device), data_.y.index_select(0, i).to(device)};
  }
  Batch test_batch(const std::vector<int64_t>& indices, torch::Device device) override {
    return train_batch(indices, device);
  }
  ddp::StepOutput loss(Batch& batch) override {
    ddp::StepOutput out;
    out.loss = torch::mse_loss(net_->forward(batch.x), batch.y);
    out.samples = batch.y.size(0);
    return out;
  }
  ddp::StepOutput evaluate(Batch& batch) override { return loss(batch); }

 private:
  Mlp net_;
  const Data& data_;
};

// What a case varies: the hook registered on the wrapper, and the optimizer.
struct Case {
  std::string name;
  std::function<ddp::CommHook()> hook;  // null: the default
  std::function<std::unique_ptr<torch::optim::Optimizer>(Mlp&)> optimizer;
  bool step_in_backward = false;  // the hook composed with the optimizer (hook_then_optimizer)
};

// One run of a case: the model, its wrapper, optimizer and task, built alike every time.
struct CaseRun {
  Mlp net;
  ddp::DistributedDataParallel model{pg(), net};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Regression task{net, data()};
  explicit CaseRun(const Case& c) : optimizer(c.optimizer(net)) {
    if (!c.hook) return;
    ddp::CommHook hook = c.hook();
    if (c.step_in_backward) hook = ddp::hook_then_optimizer(std::move(hook), *optimizer);
    model.register_comm_hook(std::move(hook));
  }
  static const Data& data() {
    static const Data d;
    return d;
  }
  torch::Tensor weights() {
    std::vector<torch::Tensor> parts;
    for (const auto& p : net->parameters()) parts.push_back(p.detach().flatten());
    return torch::cat(parts);
  }
};

ddp::TrainerOptions options(const std::string& dir) {
  ddp::TrainerOptions o;
  o.batch_size = kBatch;
  o.report.log_interval = 0;
  o.report.progress = ddp::ProgressMode::None;
  o.seed = 3;
  o.checkpoint.dir = dir;
  return o;
}

std::string shared_temp_dir(const std::string& name) {
  return ddp::all_gather_strings(pg().cpu(),
                                 rt().is_main() ? ddp_test::make_temp_dir(name) : "")[0];
}

// Uninterrupted; then stopped by SIGTERM on the last rank after kStopAfterStep and resumed from
// the snapshot the stop wrote: the same weights, bit for bit, on every rank.
void expect_exact_resume(const Case& c) {
  SCOPED_TRACE(c.name);
  torch::Tensor uninterrupted;
  {
    CaseRun run(c);
    ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, options(""), &run.model);
    ASSERT_EQ(trainer.fit(kEpochs).size(), static_cast<size_t>(kEpochs));
    uninterrupted = run.weights();
  }
  const std::string dir = shared_temp_dir("resume_exact_" + c.name);
  std::string snapshot;
  {
    CaseRun run(c);
    ddp::TrainerOptions stopped = options(dir);
    const int last = rt().world_size() - 1;
    ddp_test::AfterStep hook([&](int64_t step, int rank) {
      // Sent at the boundary after the step, read at the next one.
      if (step == kStopAfterStep - 1 && rank == last) std::raise(SIGTERM);
    });
    ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, stopped, &run.model);
    trainer.fit(kEpochs);
    ASSERT_EQ(trainer.stopped_by(), SIGTERM);
    EXPECT_EQ(trainer.global_step(), kStopAfterStep);
    snapshot = trainer.stop_snapshot();
    ASSERT_FALSE(snapshot.empty());
  }
  ddp::clear_stop_signal();
  CaseRun run(c);
  ddp::TrainerOptions resumed = options(dir);
  resumed.checkpoint.resume = snapshot;
  ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, resumed, &run.model);
  trainer.fit(kEpochs);
  const torch::Tensor weights = run.weights();
  EXPECT_TRUE(torch::equal(weights, uninterrupted))
      << "largest difference " << (weights - uninterrupted).abs().max().item<double>();
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(weights));
}

std::unique_ptr<torch::optim::Optimizer> sgd(Mlp& net) {
  return std::make_unique<torch::optim::SGD>(net->parameters(),
                                             torch::optim::SGDOptions(0.05).momentum(0.9));
}

// sgd() at twice the learning rate: a resume that changes --lr.
std::unique_ptr<torch::optim::Optimizer> faster(Mlp& net) {
  return std::make_unique<torch::optim::SGD>(net->parameters(),
                                             torch::optim::SGDOptions(0.1).momentum(0.9));
}

std::shared_ptr<ddp::PowerSGDState> powersgd_state() {
  auto state = std::make_shared<ddp::PowerSGDState>();
  state->start_powerSGD_iter = 2;  // compressed from step 3: the stop after 6 is mid-compression
  return state;
}

// ZeRO-1 beside DDP (its noop_hook leaves the gradients to ZeRO's reduce-scatter), over
// `Inner`'s shards.
template <typename Inner, typename Options>
std::function<std::unique_ptr<torch::optim::Optimizer>(Mlp&)> zero(Options o) {
  return [o](Mlp& net) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<ddp::ZeroRedundancyOptimizer>(
        net->parameters(), pg().cpu(),
        [o](std::vector<torch::Tensor> shard) { return std::make_unique<Inner>(shard, o); });
  };
}

// The premise of the PowerSGD case: the first step regroups the buckets in another order.
TEST(ResumeExact, TheModelsBucketsAreRebuiltInAnotherOrder) {
  if (rt().world_size() == 1) GTEST_SKIP() << "no Reducer at one rank";
  Mlp net;
  ddp::DistributedDataParallel model(pg(), net);
  const auto initial = model.bucket_layout();
  torch::mse_loss(net->forward(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
  EXPECT_NE(model.bucket_layout(), initial);
}

// A signal in an epoch's last step loses nothing: the epoch ends, is saved, and the ranks stop
// before the next epoch's first batch, saving there; in the run's last step the run ends as it
// would without the signal.
TEST(ResumeExact, ASignalInAnEpochsLastStepLosesNothing) {
  const int64_t steps = kSamples / rt().world_size() / kBatch;  // per epoch
  for (const int64_t after : {steps, kEpochs * steps}) {
    SCOPED_TRACE(after);
    const std::string dir = shared_temp_dir("resume_exact_last_step_" + std::to_string(after));
    CaseRun run({"allreduce", nullptr, sgd});
    const int last = rt().world_size() - 1;
    ddp_test::AfterStep hook([&](int64_t step, int rank) {
      if (step == after && rank == last) std::raise(SIGTERM);
    });
    ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, options(dir), &run.model);
    const size_t epochs = trainer.fit(kEpochs).size();
    ddp::clear_stop_signal();
    if (after < kEpochs * steps) {
      EXPECT_EQ(trainer.stopped_by(), SIGTERM);
      EXPECT_EQ(trainer.global_step(), after);
      EXPECT_EQ(trainer.stop_snapshot(), ddp::snapshot_path(dir, 2, 0));
    } else {
      EXPECT_EQ(trainer.stopped_by(), 0);
      EXPECT_EQ(epochs, static_cast<size_t>(kEpochs));
    }
    if (rt().is_main()) {
      EXPECT_TRUE(std::filesystem::exists(ddp::snapshot_path(dir, after / steps)));
    }
  }
}

TEST(ResumeExact, EveryCommHookResumesBitIdentically) {
  expect_exact_resume({"allreduce", nullptr, sgd});
  expect_exact_resume({"fp16", ddp::fp16_compress_hook, sgd});
  expect_exact_resume({"bf16", ddp::bf16_compress_hook, sgd});
  expect_exact_resume({"powersgd", [] { return ddp::powersgd_hook(powersgd_state()); }, sgd});
  // The composition's state is PowerSGD's: saved and restored as without it.
  expect_exact_resume(
      {"powersgd_then_sgd", [] { return ddp::powersgd_hook(powersgd_state()); }, sgd, true});
}

TEST(ResumeExact, ZeroRedundancyOptimizerResumesBitIdenticallyOverAnyOptimizer) {
  expect_exact_resume({"zero_sgd", ddp::noop_hook,
                       zero<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9))});
  expect_exact_resume(
      {"zero_adam", ddp::noop_hook, zero<torch::optim::Adam>(torch::optim::AdamOptions(0.01))});
  expect_exact_resume(
      {"zero_adadelta", ddp::noop_hook, zero<ddp::Adadelta>(ddp::AdadeltaOptions(1.0))});
}

// An optimizer that keeps its state in a map of its own, not in state(), as ddp::Adadelta did.
class HiddenStateSGD : public torch::optim::Optimizer {
 public:
  explicit HiddenStateSGD(std::vector<torch::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  torch::Tensor step(LossClosure = nullptr) override {
    torch::NoGradGuard no_grad;
    for (auto& p : param_groups_[0].params()) {
      if (!p.grad().defined()) continue;
      torch::Tensor& v = velocity_[p.unsafeGetTensorImpl()];
      v = v.defined() ? v.mul(0.9).add(p.grad()) : p.grad().clone();
      p.sub_(v, 0.1);
    }
    return {};
  }
  void save(torch::serialize::OutputArchive& archive) const override {
    int64_t i = 0;
    for (const auto& p : param_groups_[0].params()) {
      auto v = velocity_.find(p.unsafeGetTensorImpl());
      if (v != velocity_.end()) archive.write("v" + std::to_string(i), v->second);
      ++i;
    }
  }
  void load(torch::serialize::InputArchive& archive) override {
    int64_t i = 0;
    for (const auto& p : param_groups_[0].params()) {
      torch::Tensor v;
      if (archive.try_read("v" + std::to_string(i), v)) velocity_[p.unsafeGetTensorImpl()] = v;
      ++i;
    }
  }

 private:
  std::unordered_map<const void*, torch::Tensor> velocity_;
};

TEST(ResumeExact, StateOutsideTheOptimizersStateIsRefusedOnEveryRankNamingIt) {
  Mlp net;
  ddp::ZeroRedundancyOptimizer optimizer(
      net->parameters(), pg().cpu(), [](std::vector<torch::Tensor> shard) {
        return std::make_unique<HiddenStateSGD>(std::move(shard));
      });
  optimizer.zero_grad();
  torch::mse_loss(net->forward(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
  optimizer.step();
  try {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    FAIL() << "consolidated a state that is not in state()";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("HiddenStateSGD) saves state that its state() does not hold"),
        std::string::npos)
        << e.what();
  }
}

// A resumed run follows its own schedule. A finished 2-epoch cosine run extended to 3 epochs
// trains epoch 3 at the 3-epoch cosine's rate, not at the snapshot's rate (0, the end of its
// cosine); a per-step schedule resumed with another base rate goes on from its position on that
// base; rank 0's warning says so.
TEST(ResumeExact, AResumedRunFollowsItsOwnSchedule) {
  const auto lr = [](torch::optim::Optimizer& o) { return o.param_groups()[0].options().get_lr(); };
  {
    const std::string dir = shared_temp_dir("resume_extended");
    {
      CaseRun run({"allreduce", nullptr, sgd});
      ddp::CosineAnnealingLR cosine(*run.optimizer, 2);
      ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, options(dir), &run.model);
      trainer.fit(2, &cosine);
      EXPECT_EQ(lr(*run.optimizer), 0.0);
    }
    CaseRun run({"allreduce", nullptr, sgd});
    ddp::CosineAnnealingLR cosine(*run.optimizer, 3);
    ddp::TrainerOptions o = options(dir);
    o.checkpoint.resume = "latest";
    std::vector<double> rates;  // at every step of epoch 3
    ddp_test::AfterStep hook([&](int64_t, int) { rates.push_back(lr(*run.optimizer)); });
    ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, o, &run.model);
    trainer.fit(3, &cosine);
    ASSERT_EQ(rates.size(), static_cast<size_t>(kSamples / (kBatch * rt().world_size())));
    const double cosine_at_2_of_3 = 0.05 * (1.0 + std::cos(std::acos(-1.0) * 2.0 / 3.0)) / 2.0;
    for (const double rate : rates) EXPECT_DOUBLE_EQ(rate, cosine_at_2_of_3);
  }
  const std::string dir = shared_temp_dir("resume_rebased");
  ddp::LRScheduleOptions s;
  s.decay = ddp::LRDecay::Cosine;
  s.decay_steps = 1000;
  {
    CaseRun run({"allreduce", nullptr, sgd});  // base 0.05
    ddp::LRSchedule schedule(*run.optimizer, s);
    ddp::TrainerOptions o = options(dir);
    o.lr_schedule = &schedule;
    ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, o, &run.model);
    trainer.fit(1);
  }
  CaseRun run({"allreduce", nullptr, faster});
  ddp::LRSchedule schedule(*run.optimizer, s);
  ddp::TrainerOptions o = options(dir);
  o.lr_schedule = &schedule;
  o.checkpoint.resume = "latest";
  testing::internal::CaptureStdout();
  {
    ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, o, &run.model);
    trainer.fit(2);
  }
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(schedule.position(), 2 * kSamples / (kBatch * rt().world_size()));
  EXPECT_EQ(schedule.base_lrs()[0], 0.1);
  EXPECT_EQ(lr(*run.optimizer), schedule.lrs_at(schedule.position())[0]);
  if (rt().is_main()) {
    EXPECT_NE(out.find("the snapshot's settings are restored with its state, so this run's are "
                       "not used, except a learning rate that this run's schedule sets\n"),
              std::string::npos)
        << out;
  }
}

// A resume with another comm hook and another optimizer learning rate: one warning line each,
// naming the setting, both values and what it costs (the optimizer's: the snapshot's are used).
TEST(ResumeExact, ChangedSettingsAreNamedAtResume) {
  const std::string dir = shared_temp_dir("resume_settings");
  {
    CaseRun run({"powersgd", [] { return ddp::powersgd_hook(powersgd_state()); }, sgd});
    ddp::TrainerOptions o = options(dir);
    ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, o, &run.model);
    trainer.fit(1);
  }
  CaseRun run({"allreduce", nullptr, faster});
  ddp::TrainerOptions o = options(dir);
  o.checkpoint.resume = "latest";
  o.accumulate = 2;
  testing::internal::CaptureStdout();
  {
    ddp::Trainer trainer(pg(), *run.net, run.task, *run.optimizer, o, &run.model);
    trainer.fit(2);
  }
  const std::string out = testing::internal::GetCapturedStdout();
  // What the warning says: the optimizer's settings came back with its state.
  EXPECT_EQ(run.optimizer->param_groups()[0].options().get_lr(), 0.05);
  if (!rt().is_main()) {
    EXPECT_EQ(out.find("Warning: the "), std::string::npos) << "rank 0 alone says it";
    return;
  }
  const std::string cost =
      "the run goes on, but no longer on the trajectory the snapshot's run "
      "would have followed";
  EXPECT_NE(out.find("Warning: the optimizer is torch::optim::SGD (dampening=0, lr=0.1, "
                     "momentum=0.9, nesterov=false, weight_decay=0), the snapshot's run had "
                     "torch::optim::SGD (dampening=0, lr=0.05, momentum=0.9, nesterov=false, "
                     "weight_decay=0): the snapshot's settings are restored with its state, so "
                     "this run's are not used"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("Warning: the gradient accumulation (micro-batches per step) is 2, the "
                     "snapshot's run had 1: " +
                     cost),
            std::string::npos)
      << out;
  if (rt().world_size() > 1) {
    EXPECT_NE(out.find("Warning: the comm hook is allreduce, the snapshot's run had "
                       "powersgd(matrix_approximation_rank=1, start_powerSGD_iter=2, "),
              std::string::npos)
        << out;
  }
  EXPECT_EQ(out.find("mixed precision is"), std::string::npos)
      << "unchanged settings are not named";
}

}  // namespace test_resume_exact

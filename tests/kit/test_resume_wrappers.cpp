// A resume never silently differs (issue 60): a snapshot holds the comm hook state of every
// DistributedDataParallel wrapper of the modules it saves, found from the modules. A Checkpointer
// given the module (not the wrapper), a GAN's two models each with its own wrapper, and a wrapper
// of a module inside the saved one all resume a PowerSGD run bit-identically, and a snapshot loads
// back into the wrapper that trained on from it; a stateful hook whose state a snapshot could not
// hold (the wrapper of a model not saved, or of a module that holds a saved one and more) is
// refused before training, naming the wrapped module and the hook; a snapshot without a wrapper's
// state resumes with a warning naming it. PowerSGD runs at one rank too
// (DDPOptions::reducer_at_one_rank), so every case runs at 1, 2 and 4 ranks.
#include <ddp/comm_hook.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/checkpointer.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace test_resume_wrappers {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

std::string shared_dir(const std::string& name) {
  return ddp::all_gather_strings(pg().cpu(),
                                 rt().is_main() ? ddp_test::make_temp_dir(name) : "")[0];
}

std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

constexpr int64_t kSteps = 8, kSaveAfter = 5;

// 6 -> 16 -> 3; PowerSGD compresses its 16x6 and 3x16 weights.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(uint64_t seed) {
    torch::manual_seed(seed);
    a = register_module("a", torch::nn::Linear(6, 16));
    b = register_module("b", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return b(torch::tanh(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Mlp);

// An Mlp inside a module of its own, with a layer beside it.
struct OuterImpl : torch::nn::Module {
  OuterImpl()
      : body(register_module("body", Mlp(3))),
        scale(register_module("scale", torch::nn::Linear(3, 3))) {}
  Mlp body;
  torch::nn::Linear scale;
};
TORCH_MODULE(Outer);

ddp::DDPOptions at_one_rank_too() {
  ddp::DDPOptions o;
  o.reducer_at_one_rank = true;  // PowerSGD runs at one rank too
  return o;
}

ddp::CommHook powersgd() {
  auto state = std::make_shared<ddp::PowerSGDState>();
  state->start_powerSGD_iter = 2;  // compressed from step 3: the save after 5 is mid-compression
  return ddp::powersgd_hook(state);
}

// A model, its wrapper with PowerSGD and its optimizer.
struct Wrapped {
  Mlp net;
  ddp::DistributedDataParallel model;
  torch::optim::SGD optimizer;
  explicit Wrapped(Mlp module)
      : net(std::move(module)),
        model(pg(), net, at_one_rank_too()),
        optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)) {
    model.register_comm_hook(powersgd());
  }
  // One step on this rank's data for `step` (different on every rank).
  void step(int64_t step) {
    torch::manual_seed(static_cast<uint64_t>(1000 * step + rt().rank()));
    const torch::Tensor x = torch::randn({4, 6}), y = torch::randn({4, 3});
    optimizer.zero_grad();
    torch::mse_loss(model(x), y).backward();
    optimizer.step();
  }
};

torch::Tensor flat(torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

ddp::CheckpointerOptions options(const std::string& dir) {
  ddp::CheckpointerOptions o;
  o.dir = dir;
  return o;
}

// The Checkpointer given the module `net`, not its wrapper: the wrapper is found from it.
TEST(ResumeWrappers, ACheckpointerGivenTheModuleResumesItsWrappersHookExactly) {
  torch::Tensor uninterrupted;
  {
    Wrapped run(Mlp(1));
    for (int64_t s = 0; s < kSteps; ++s) run.step(s);
    uninterrupted = flat(*run.net);
  }
  const std::string dir = shared_dir("resume_wrappers_module");
  {
    Wrapped run(Mlp(1));
    ddp::Checkpointer checkpointer(pg(), *run.net, run.optimizer, options(dir));
    checkpointer.resume();
    for (int64_t s = 0; s < kSaveAfter; ++s) run.step(s);
    checkpointer.save_step({1, kSaveAfter, kSaveAfter}, {});
  }
  Wrapped run(Mlp(2));  // other weights: all of it comes from the snapshot
  ddp::CheckpointerOptions resume = options(dir);
  resume.resume = "latest";
  ddp::Checkpointer checkpointer(pg(), *run.net, run.optimizer, resume);
  ASSERT_EQ(checkpointer.resume().position.step, kSaveAfter);
  for (int64_t s = kSaveAfter; s < kSteps; ++s) run.step(s);
  const torch::Tensor weights = flat(*run.net);
  EXPECT_TRUE(torch::equal(weights, uninterrupted))
      << "largest difference " << (weights - uninterrupted).abs().max().item<double>();
}

// Two models with a wrapper and a PowerSGD state each, in one snapshot (SnapshotParts).
struct TwoModels {
  Wrapped a{Mlp(1)}, b{Mlp(2)};
  ddp::SnapshotParts parts() {
    return {{{"a", a.net.ptr().get()}, {"b", b.net.ptr().get()}},
            {{"a", &a.optimizer}, {"b", &b.optimizer}}};
  }
  void step(int64_t s) {
    a.step(s);
    b.step(s + 100);
  }
};

TEST(ResumeWrappers, TwoModelsEachWithItsWrapperResumeExactly) {
  torch::Tensor uninterrupted;
  {
    TwoModels run;
    for (int64_t s = 0; s < kSteps; ++s) run.step(s);
    uninterrupted = torch::cat({flat(*run.a.net), flat(*run.b.net)});
  }
  const std::string dir = shared_dir("resume_wrappers_two");
  {
    TwoModels run;
    ddp::Checkpointer checkpointer(pg(), run.parts(), options(dir));
    checkpointer.resume();
    for (int64_t s = 0; s < kSaveAfter; ++s) run.step(s);
    checkpointer.save_step({1, kSaveAfter, kSaveAfter}, {});
  }
  TwoModels run;
  ddp::CheckpointerOptions resume = options(dir);
  resume.resume = "latest";
  ddp::Checkpointer checkpointer(pg(), run.parts(), resume);
  testing::internal::CaptureStderr();
  checkpointer.resume();
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.find("Warning"), std::string::npos) << warnings;
  for (int64_t s = kSaveAfter; s < kSteps; ++s) run.step(s);
  const torch::Tensor weights = torch::cat({flat(*run.a.net), flat(*run.b.net)});
  EXPECT_TRUE(torch::equal(weights, uninterrupted))
      << "largest difference " << (weights - uninterrupted).abs().max().item<double>();
}

// The wrapper of `body`, inside the saved Outer: its state is saved under "body".
TEST(ResumeWrappers, AWrapperOfAModuleInsideTheSavedOneResumesExactly) {
  auto make = [] {
    struct Run {
      Outer outer;
      ddp::DistributedDataParallel model{pg(), outer->body, at_one_rank_too()};
      torch::optim::SGD optimizer{outer->parameters(), torch::optim::SGDOptions(0.05)};
    };
    auto run = std::make_unique<Run>();
    run->model.register_comm_hook(powersgd());
    return run;
  };
  auto step = [](auto& run, int64_t s) {
    torch::manual_seed(static_cast<uint64_t>(1000 * s + rt().rank()));
    const torch::Tensor x = torch::randn({4, 6});
    run.optimizer.zero_grad();
    // `scale` takes no part: only `body`, wrapped, trains.
    run.model(x).pow(2).mean().backward();
    run.optimizer.step();
  };
  torch::Tensor uninterrupted;
  {
    auto run = make();
    for (int64_t s = 0; s < kSteps; ++s) step(*run, s);
    uninterrupted = flat(*run->outer->body);
  }
  const std::string dir = shared_dir("resume_wrappers_inside");
  {
    auto run = make();
    ddp::Checkpointer checkpointer(pg(), *run->outer, run->optimizer, options(dir));
    checkpointer.resume();
    for (int64_t s = 0; s < kSaveAfter; ++s) step(*run, s);
    checkpointer.save_step({1, kSaveAfter, kSaveAfter}, {});
  }
  auto run = make();
  ddp::CheckpointerOptions resume = options(dir);
  resume.resume = "latest";
  ddp::Checkpointer checkpointer(pg(), *run->outer, run->optimizer, resume);
  checkpointer.resume();
  for (int64_t s = kSaveAfter; s < kSteps; ++s) step(*run, s);
  EXPECT_TRUE(torch::equal(flat(*run->outer->body), uninterrupted));
}

// Loaded back into the wrapper that wrote it, after training on: its buckets are in the saved
// order already, so the load is not refused as one after the first backward would be.
TEST(ResumeWrappers, ASnapshotLoadsBackIntoTheWrapperThatTrainedOnFromIt) {
  const std::string dir = shared_dir("resume_wrappers_reload");
  Wrapped run(Mlp(1));
  ddp::Checkpointer checkpointer(pg(), *run.net, run.optimizer, options(dir));
  checkpointer.resume();
  for (int64_t s = 0; s < kSaveAfter; ++s) run.step(s);
  const std::string path = checkpointer.save_step({1, kSaveAfter, kSaveAfter}, {});
  const torch::Tensor saved = flat(*run.net).clone();
  run.step(kSaveAfter);
  ddp::load_snapshot(path, pg().cpu(), {{{"", run.net.ptr().get()}}, {{"", &run.optimizer}}},
                     nullptr);
  EXPECT_TRUE(torch::equal(flat(*run.net), saved));
}

// A GAN's second model left out of the Checkpointer: its hook state (and weights) would restart.
TEST(ResumeWrappers, AStatefulHookOnAModelTheSnapshotDoesNotHoldIsRefusedNamingIt) {
  TwoModels run;
  const std::string dir = shared_dir("resume_wrappers_refused");
  ddp::Checkpointer checkpointer(pg(), *run.a.net, run.a.optimizer, options(dir));
  const std::string refused = message_of([&] { checkpointer.resume(); });
  EXPECT_NE(
      refused.find(
          "Checkpointer: a DistributedDataParallel wraps a test_resume_wrappers::MlpImpl (4 "
          "parameters, the first 'a.weight'), which this snapshot does not hold, and its comm "
          "hook powersgd(matrix_approximation_rank=1, start_powerSGD_iter=2"),
      std::string::npos)
      << refused;
  EXPECT_NE(refused.find("keeps state between steps: a resume would restart that state, "
                         "silently. Save that module too (one Checkpointer of SnapshotParts"),
            std::string::npos)
      << refused;
  // At a save as well (a hook registered after resume()), before anything is written.
  const std::string at_save = message_of([&] { checkpointer.save_step({1, 1, 1}, {}); });
  EXPECT_EQ(at_save.rfind(
                "Checkpointer: a DistributedDataParallel wraps a test_resume_wrappers::MlpImpl", 0),
            0u)
      << at_save;
  if (rt().is_main()) EXPECT_TRUE(ddp::list_snapshots(dir).empty());
}

// The wrapper of the whole Outer, with only its body saved: the hook's state covers more.
TEST(ResumeWrappers, AStatefulHookOnAModuleThatHoldsTheSavedOneIsRefusedNamingIt) {
  Outer outer;
  auto holder = outer.ptr();
  ddp::DistributedDataParallel model(pg(), std::shared_ptr<torch::nn::Module>(holder),
                                     at_one_rank_too());
  model.register_comm_hook(powersgd());
  torch::optim::SGD optimizer(outer->body->parameters(), torch::optim::SGDOptions(0.05));
  ddp::Checkpointer checkpointer(pg(), *outer->body, optimizer, options(""));
  const std::string refused = message_of([&] { checkpointer.resume(); });
  EXPECT_NE(refused.find(
                "Checkpointer: a DistributedDataParallel wraps a test_resume_wrappers::OuterImpl "
                "(6 parameters, the first 'body.a.weight'), which holds modules of this "
                "snapshot and more, and its comm hook powersgd("),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("Give the Checkpointer the wrapped module (DistributedDataParallel::"
                         "module()) or the wrapper"),
            std::string::npos)
      << refused;
}

// Two live wrappers of one module: which state is whose could not be told at resume.
TEST(ResumeWrappers, TwoWrappersOfOneSavedModuleAreRefused) {
  Wrapped run(Mlp(1));
  ddp::DistributedDataParallel second(pg(), run.net);
  ddp::Checkpointer checkpointer(pg(), *run.net, run.optimizer, options(""));
  EXPECT_EQ(message_of([&] { checkpointer.resume(); }),
            "Checkpointer: two DistributedDataParallel wrappers wrap the model, a "
            "test_resume_wrappers::MlpImpl (4 parameters, the first 'a.weight'): a snapshot could "
            "not tell their states apart; keep one wrapper per module");
}

// A snapshot written without the wrapper, resumed with a stateful hook: said, naming it.
TEST(ResumeWrappers, ASnapshotWithoutTheWrappersStateIsNamedAtResume) {
  const std::string dir = shared_dir("resume_wrappers_none");
  {
    Mlp net(1);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    ddp::Checkpointer checkpointer(pg(), *net, optimizer, options(dir));
    checkpointer.save_epoch(1, 2);
  }
  Wrapped run(Mlp(1));
  ddp::CheckpointerOptions resume = options(dir);
  resume.resume = "latest";
  ddp::Checkpointer checkpointer(pg(), *run.net, run.optimizer, resume);
  testing::internal::CaptureStderr();
  checkpointer.resume();
  const std::string warnings = testing::internal::GetCapturedStderr();
  if (!rt().is_main()) {
    EXPECT_EQ(warnings.find("Warning"), std::string::npos) << "rank 0 alone says it";
    return;
  }
  EXPECT_NE(warnings.find("snapshot_epoch1.pt: the model's wrapper: the comm hook "
                          "powersgd(matrix_approximation_rank=1"),
            std::string::npos)
      << warnings;
  EXPECT_NE(warnings.find("starts with a fresh state: the snapshot holds no state of this "
                          "wrapper (written by an older ddp, or by a run without it)"),
            std::string::npos)
      << warnings;
}

}  // namespace test_resume_wrappers

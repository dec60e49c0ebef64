// The training pieces of issue 13 against PyTorch 2.x, in one process: clip_grad_norm against
// torch.nn.utils.clip_grad_norm_, LRSchedule against torch's scheduler classes, GradScaler against
// torch.amp.GradScaler("cpu"), Autocast against torch.autocast("cpu", dtype=torch.bfloat16). The
// reference scripts are tests/reference/*.py, run with the .venv's torch (the LibTorch's version).
#include <ddp/train/autocast.h>
#include <ddp/train/grad_clip.h>
#include <ddp/train/grad_scaler.h>
#include <ddp/train/lr_schedule.h>

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>

namespace {

std::string reference(const std::string& script) {
  return ddp_test::run_command(std::string(DDP_PYTHON) + " " + DDP_TEST_DIR + "/reference/" +
                               script);
}

// "key ... : v0 v1 ..." -> (the words before the colon, the numbers after it).
std::pair<std::vector<std::string>, std::vector<double>> split_line(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> head;
  for (std::string word; in >> word && word != ":";) head.push_back(word);
  std::vector<double> values;
  for (std::string word; in >> word;) {
    values.push_back(word == "nan" ? std::nan("") : word == "inf" ? INFINITY : std::stod(word));
  }
  return {head, values};
}

// ----------------------------------------------------------------------------------------------
// clip_grad_norm

TEST(ClipGradNorm, MatchesPyTorch) {
  std::istringstream lines(reference("clip_grad.py"));
  int configs = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto [head, expected] = split_line(line);
    ASSERT_EQ(head.size(), 2u) << line;
    const double max_norm = std::stod(head[0]);
    const double norm_type =
        head[1] == "inf" ? std::numeric_limits<double>::infinity() : std::stod(head[1]);
    ASSERT_EQ(expected.size(), 1u + 12 + 5) << line;

    torch::Tensor a = torch::zeros({3, 4}, torch::requires_grad());
    torch::Tensor b = torch::zeros({5}, torch::requires_grad());
    torch::Tensor c = torch::zeros({2}, torch::requires_grad());  // no gradient: skipped
    a.mutable_grad() = (torch::sin(torch::arange(12, torch::kDouble) * 0.7) * 1.5)
                           .to(torch::kFloat)
                           .reshape({3, 4});
    b.mutable_grad() = (torch::cos(torch::arange(5, torch::kDouble) * 1.1) * 0.8).to(torch::kFloat);
    const double total = ddp::clip_grad_norm({a, b, c}, max_norm, norm_type);

    EXPECT_NEAR(total, expected[0], 1e-6 * expected[0]) << line;
    const torch::Tensor got = torch::cat({a.grad().flatten(), b.grad()}).to(torch::kDouble);
    const torch::Tensor want =
        torch::tensor(std::vector<double>(expected.begin() + 1, expected.end()), torch::kDouble);
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-7)
        << "max_norm " << max_norm << " norm " << head[1];
    EXPECT_FALSE(c.grad().defined());
    ++configs;
  }
  EXPECT_EQ(configs, 5);
}

TEST(ClipGradNorm, ClipsToMaxNormAndRefusesBadArguments) {
  torch::Tensor p = torch::zeros({2}, torch::requires_grad());
  p.mutable_grad() = torch::tensor({3.0f, 4.0f});
  EXPECT_DOUBLE_EQ(ddp::clip_grad_norm({p}, 1.0), 5.0);
  EXPECT_NEAR(p.grad().norm().item<double>(), 1.0, 1e-6);
  EXPECT_EQ(ddp::clip_grad_norm({torch::zeros({1}, torch::requires_grad())}, 1.0), 0.0);

  auto message = [&](double max_norm, double norm_type) -> std::string {
    try {
      ddp::clip_grad_norm({p}, max_norm, norm_type);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(std::nan(""), 2).find("clip_grad_norm: max_norm must be >= 0"),
            std::string::npos);
  EXPECT_NE(message(-1, 2).find("max_norm"), std::string::npos);
  EXPECT_NE(message(1, 0.5).find("norm_type must be >= 1 or infinity"), std::string::npos);

  p.mutable_grad() = torch::tensor({std::nanf(""), 1.0f});
  EXPECT_THROW(ddp::clip_grad_norm({p}, 1.0, 2.0, /*error_if_nonfinite=*/true), std::runtime_error);
}

// ----------------------------------------------------------------------------------------------
// LRSchedule

TEST(LRSchedule, MatchesPyTorchSchedulerClassesStepByStep) {
  auto make = [](int64_t warmup, double start, ddp::LRDecay decay, int64_t n, double x,
                 double scale) {
    ddp::LRScheduleOptions o;
    o.warmup_steps = warmup;
    o.warmup_start_factor = start;
    o.decay = decay;
    if (decay == ddp::LRDecay::Cosine) {
      o.decay_steps = n;
      o.min_lr = x;
    } else if (decay == ddp::LRDecay::Step) {
      o.step_size = n;
      o.gamma = x;
    }
    if (scale != 1.0) {  // the linear scaling rule: global batch 256 * scale over a reference 256
      o.reference_batch = 256;
      o.global_batch = static_cast<int64_t>(256 * scale);
    }
    return o;
  };
  // The configurations of tests/reference/lr_schedule.py, by name.
  std::map<std::string, ddp::LRScheduleOptions> configs = {
      {"warmup_cosine", make(5, 0.1, ddp::LRDecay::Cosine, 20, 0.001, 1.0)},
      {"warmup_step", make(4, 0.25, ddp::LRDecay::Step, 7, 0.5, 1.0)},
      {"cosine_only", make(0, 0.1, ddp::LRDecay::Cosine, 30, 0.0, 1.0)},
      {"warmup_constant_scaled", make(6, 0.01, ddp::LRDecay::Constant, 0, 0.0, 4.0)},
      {"warmup_cosine_scaled", make(3, 0.5, ddp::LRDecay::Cosine, 10, 0.0001, 2.0)},
  };
  std::istringstream lines(reference("lr_schedule.py"));
  size_t seen = 0;
  int64_t bit_differences = 0;  // rates equal to rounding, but not bit for bit
  for (std::string line; std::getline(lines, line);) {
    const auto [head, python] = split_line(line);
    ASSERT_EQ(head.size(), 1u) << line;
    ASSERT_TRUE(configs.count(head[0])) << head[0];
    torch::Tensor w1 = torch::zeros({1}, torch::requires_grad());
    torch::Tensor w2 = torch::zeros({1}, torch::requires_grad());
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{w1},
                        std::make_unique<torch::optim::SGDOptions>(0.1));
    groups.emplace_back(std::vector<torch::Tensor>{w2},
                        std::make_unique<torch::optim::SGDOptions>(0.02));
    torch::optim::SGD optimizer(groups, torch::optim::SGDOptions(0.1));
    ddp::LRSchedule schedule(optimizer, configs[head[0]]);
    ASSERT_EQ(python.size() % 2, 0u);
    for (size_t t = 0; t < python.size() / 2; ++t) {
      for (size_t g = 0; g < 2; ++g) {
        const double ours = optimizer.param_groups()[g].options().get_lr();
        // PyTorch updates recursively, LRSchedule uses the closed form: equal to rounding.
        EXPECT_NEAR(ours, python[2 * t + g], 1e-12 + 1e-10 * std::abs(python[2 * t + g]))
            << head[0] << ": step " << t << ", group " << g;
        bit_differences += ours != python[2 * t + g];
      }
      optimizer.step();
      schedule.step();
    }
    ++seen;
  }
  EXPECT_EQ(seen, configs.size());
  // What docs/training_loop.md says: the last bits differ (were they equal, say so there).
  EXPECT_GT(bit_differences, 0);
}

// load() restores the position; the base rates are the loading schedule's own: the same base
// continues exactly, another (a resumed run's other --lr) takes effect from that position.
TEST(LRSchedule, LoadRestoresThePositionOnItsOwnBaseRates) {
  torch::Tensor w = torch::zeros({1}, torch::requires_grad());
  ddp::LRScheduleOptions o;
  o.warmup_steps = 3;
  o.decay = ddp::LRDecay::Cosine;
  o.decay_steps = 10;
  torch::optim::SGD a_opt({w}, torch::optim::SGDOptions(0.5));
  ddp::LRSchedule a(a_opt, o);
  for (int i = 0; i < 7; ++i) a.step();
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    a.save(archive);
    archive.save_to(saved);
  }
  auto load = [&](ddp::LRSchedule& schedule) {
    torch::serialize::InputArchive archive;
    saved.seekg(0);
    archive.load_from(saved);
    schedule.load(archive);
  };
  torch::optim::SGD b_opt({w}, torch::optim::SGDOptions(0.5));
  ddp::LRSchedule b(b_opt, o);
  load(b);
  EXPECT_EQ(b.position(), 7);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(b_opt.param_groups()[0].options().get_lr(),
              a_opt.param_groups()[0].options().get_lr())
        << i;
    a.step();
    b.step();
  }
  torch::optim::SGD c_opt({w}, torch::optim::SGDOptions(0.25));
  ddp::LRSchedule c(c_opt, o);
  load(c);
  EXPECT_EQ(c.position(), 7);
  EXPECT_EQ(c.base_lrs()[0], 0.25);
  EXPECT_EQ(c_opt.param_groups()[0].options().get_lr(), c.lrs_at(7)[0]);
  EXPECT_NE(c.lrs_at(7)[0], b.lrs_at(7)[0]);  // base 0.5
}

TEST(LRSchedule, RefusesOptionsOutOfRangeNamingThem) {
  torch::Tensor w = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
  auto message = [&](ddp::LRScheduleOptions o) -> std::string {
    try {
      ddp::LRSchedule schedule(opt, o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  ddp::LRScheduleOptions o;
  EXPECT_EQ(message(o), "");
  o.warmup_steps = -1;
  EXPECT_EQ(message(o), "LRScheduleOptions::warmup_steps must be >= 0 (got -1)");
  o = {};
  o.warmup_start_factor = 0;
  EXPECT_NE(message(o).find("LRScheduleOptions::warmup_start_factor must be in (0, 1]"),
            std::string::npos);
  o = {};
  o.decay = ddp::LRDecay::Cosine;
  EXPECT_EQ(message(o),
            "LRScheduleOptions::decay_steps must be >= 1 with the cosine decay (got 0)");
  o = {};
  o.reference_batch = 256;
  EXPECT_NE(message(o).find("LRScheduleOptions::global_batch must be >= 1"), std::string::npos);
  EXPECT_THROW(ddp::parse_lr_decay("linear"), std::invalid_argument);
  EXPECT_EQ(ddp::parse_lr_decay("cosine"), ddp::LRDecay::Cosine);
}

// The linear scaling rule as a function of its own (the examples' --scale-lr-with-batch).
TEST(LRSchedule, LinearScalingRuleScalesWithTheGlobalBatch) {
  EXPECT_EQ(ddp::global_batch_size(64, 4, 2), 512);
  EXPECT_DOUBLE_EQ(ddp::scale_lr_with_batch(0.1, 512, 256), 0.2);
  EXPECT_DOUBLE_EQ(ddp::scale_lr_with_batch(0.1, 64, 256), 0.025);
  EXPECT_EQ(ddp::scale_lr_with_batch(0.1, 512, 0), 0.1);  // 0: off
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message([] { ddp::scale_lr_with_batch(0.1, 512, -1); }),
            "scale_lr_with_batch: reference_batch must be >= 0 (0: no scaling), got -1");
  EXPECT_NE(
      message([] { ddp::scale_lr_with_batch(0.1, 0, 256); }).find("global_batch must be >= 1"),
      std::string::npos);
  EXPECT_NE(message([] { ddp::scale_lr_with_batch(NAN, 8, 256); }).find("lr must be finite"),
            std::string::npos);
  EXPECT_EQ(message([] { ddp::global_batch_size(64, 0, 1); }),
            "global_batch_size: ranks must be >= 1, got 0");
  EXPECT_NE(message([] { ddp::global_batch_size(64, 2, 0); }).find("accumulate must be >= 1"),
            std::string::npos);

  // Every parameter group of an optimizer, and the same base as LRScheduleOptions's scaling.
  torch::Tensor a = torch::zeros({1}, torch::requires_grad()),
                b = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd(
      {torch::optim::OptimizerParamGroup({a}, std::make_unique<torch::optim::SGDOptions>(0.1)),
       torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.03))},
      torch::optim::SGDOptions(0.1));
  ddp::scale_lr_with_batch(sgd, ddp::global_batch_size(32, 2, 2), 64);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[1].options().get_lr(), 0.06);
  torch::optim::SGD other({a}, torch::optim::SGDOptions(0.1));
  ddp::LRScheduleOptions o;
  o.reference_batch = 64;
  o.global_batch = 128;
  EXPECT_DOUBLE_EQ(ddp::LRSchedule(other, o).base_lrs()[0], 0.2);
}

// ----------------------------------------------------------------------------------------------
// GradScaler

torch::Tensor coefficients(int t) {
  torch::Tensor c = torch::cos(torch::arange(4, torch::kDouble) * 0.3 + t).to(torch::kFloat);
  if (t == 2) c[1] = INFINITY;
  if (t == 5) c[0] = NAN;
  if (t == 8 || t == 9) c = c * 1e36;
  return c;
}

TEST(GradScaler, MatchesTorchAmpGradScalerScalesSkipsAndWeights) {
  std::istringstream lines(reference("grad_scaler.py"));
  torch::Tensor w =
      (torch::sin(torch::arange(4, torch::kDouble)) * 0.5).to(torch::kFloat).requires_grad_();
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.01));
  ddp::GradScalerOptions options;
  options.init_scale = 1024;
  options.growth_interval = 3;
  ddp::GradScaler scaler(nullptr, options);
  int steps = 0, skipped = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("w :", 0) == 0) {
      const auto [head, want] = split_line(line);
      ASSERT_EQ(want.size(), 4u);
      for (size_t i = 0; i < 4; ++i)
        EXPECT_EQ(w[i].item<float>(), static_cast<float>(want[i])) << "w[" << i << "]";
      continue;
    }
    std::istringstream in(line);
    int t, stepped;
    double scale;
    int64_t tracker;
    ASSERT_TRUE(in >> t >> stepped >> scale >> tracker) << line;
    ASSERT_EQ(t, steps);
    opt.zero_grad();
    torch::Tensor loss = (w * coefficients(t)).sum();
    scaler.scale(loss).backward();
    EXPECT_EQ(scaler.step(opt), stepped == 1) << "step " << t;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), scale) << "step " << t;
    EXPECT_EQ(scaler.growth_tracker(), tracker) << "step " << t;
    skipped += stepped == 0;
    ++steps;
  }
  EXPECT_EQ(steps, 14);
  EXPECT_EQ(skipped, 3);  // the inf, the NaN and the overflow of 1e36 * 512 (1e36 * 256 fits)
}

TEST(GradScaler, SaveAndLoadContinueTheSameScales) {
  torch::Tensor w = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.01));
  ddp::GradScalerOptions options;
  options.init_scale = 256;
  options.growth_interval = 2;
  ddp::GradScaler a(nullptr, options);
  auto iterate = [&](ddp::GradScaler& scaler, int t) {
    opt.zero_grad();
    scaler.scale((w * coefficients(t)).sum()).backward();
    scaler.step(opt);
    scaler.update();
  };
  for (int t = 0; t < 4; ++t) iterate(a, t);  // grows, backs off at t = 2, ...
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    a.save(archive);
    archive.save_to(saved);
  }
  ddp::GradScaler b(nullptr, options);
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  b.load(archive);
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), a.growth_tracker());
  for (int t = 4; t < 10; ++t) {
    iterate(a, t);
    iterate(b, t);
    EXPECT_EQ(b.get_scale(), a.get_scale()) << t;
  }
}

TEST(GradScaler, MisuseIsAnErrorNamingTheCall) {
  torch::Tensor w = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.01));
  ddp::GradScaler scaler(nullptr);
  EXPECT_THROW(scaler.update(), std::logic_error);  // nothing unscaled yet
  scaler.scale(w.sum()).backward();
  scaler.unscale_(opt);
  EXPECT_THROW(scaler.unscale_(opt), std::logic_error);
  scaler.step(opt);
  EXPECT_THROW(scaler.step(opt), std::logic_error);
  scaler.update();
  ddp::GradScalerOptions bad;
  bad.backoff_factor = 1.5;
  try {
    ddp::GradScaler refused(nullptr, bad);
    FAIL() << "accepted backoff_factor 1.5";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("GradScalerOptions::backoff_factor must be in (0, 1)"),
              std::string::npos);
  }
}

// ----------------------------------------------------------------------------------------------
// Autocast

TEST(Autocast, Bf16OnCpuGivesTorchAutocastsDtypes) {
  std::istringstream lines(reference("autocast.py"));
  torch::nn::Linear lin(4, 3);
  {
    torch::NoGradGuard no_grad;
    lin->weight.copy_((torch::sin(torch::arange(12, torch::kDouble) * 0.9) * 0.5)
                          .to(torch::kFloat)
                          .reshape({3, 4}));
    lin->bias.copy_((torch::cos(torch::arange(3, torch::kDouble)) * 0.1).to(torch::kFloat));
  }
  const torch::Tensor x =
      torch::sin(torch::arange(8, torch::kDouble) * 0.37).to(torch::kFloat).reshape({2, 4});
  const torch::Tensor target = torch::zeros({2, 3});
  std::map<std::string, torch::Tensor> ours;
  torch::Tensor y;
  {
    ddp::Autocast autocast(torch::kCPU, torch::kBFloat16);
    y = lin(x);
    ours["linear"] = y;
    ours["relu"] = torch::relu(y);
    ours["matmul"] = torch::matmul(x, x.t());
    ours["log_softmax"] = torch::log_softmax(y, 1);
    ours["mse_loss"] = torch::mse_loss(y, target);
    ours["add_fp32"] = y + target;
    {
      ddp::Autocast off(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
      ours["nested_disabled_linear"] = lin(x);
    }
  }
  ours["after_linear"] = lin(x);
  size_t compared = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("linear :", 0) == 0) {
      const auto [head, want] = split_line(line);
      const torch::Tensor got = y.to(torch::kDouble).flatten();
      ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
      EXPECT_LE((got - torch::tensor(want, torch::kDouble)).abs().max().item<double>(), 1e-6);
      continue;
    }
    std::istringstream in(line);
    std::string name, dtype;
    in >> name >> dtype;
    ASSERT_TRUE(ours.count(name)) << name;
    EXPECT_EQ(std::string(c10::toString(ours[name].scalar_type())), dtype) << name;
    ++compared;
  }
  EXPECT_EQ(compared, ours.size());
  EXPECT_EQ(ours["linear"].scalar_type(), torch::kBFloat16);  // autocast really was on

  // Backward outside the guard: fp32 gradients for the fp32 parameters.
  torch::mse_loss(y.to(torch::kFloat), target).backward();
  EXPECT_EQ(lin->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_THROW(ddp::Autocast(torch::kCPU, torch::kFloat), std::invalid_argument);
  EXPECT_EQ(ddp::parse_amp_mode("bf16"), ddp::AmpMode::Bf16);
  EXPECT_THROW(ddp::parse_amp_mode("fp8"), std::invalid_argument);
}

}  // namespace

// DDPOptions::gradient_as_bucket_view (reducer.h): with every grad() a view into its bucket,
// training is bit-identical to copying the gradients in and out: losses, averaged gradients,
// clip_grad_norm's norms and weights, step by step, at this test's world size (1 with the
// reducer at one rank, 2 and 4), with no_sync() accumulation, unused parameters, the bucket
// rebuild, per-parameter buckets, fp16 compression, PowerSGD, loss scaling and bf16 autocast.
// After every synchronised backward the grads are views of one flat storage per bucket, in
// bucket order, also after the rebuild has regrouped the buckets.
#include <ddp/comm_hook.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/autocast.h>
#include <ddp/train/grad_clip.h>
#include <ddp/train/grad_scaler.h>

#include "test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace test_bucket_view {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

using Layout = std::vector<std::vector<size_t>>;

// Registered in another order than backward produces the gradients (head, extra, conv), so the
// rebuild after the first backward regroups the buckets. `extra` is the optional head.
struct Net : torch::nn::Module {
  Net()
      : head(register_module("head", torch::nn::Linear(4 * 6 * 6, 10))),
        extra(register_module("extra", torch::nn::Linear(4 * 6 * 6, 10))),
        conv(register_module("conv", torch::nn::Conv2d(3, 4, 3))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_extra) {
    const torch::Tensor h = torch::relu(conv(x)).flatten(1);
    return torch::log_softmax(use_extra ? head(h) + extra(h) : head(h), 1);
  }
  torch::nn::Linear head, extra;
  torch::nn::Conv2d conv;
};

enum class Zero { Reset, InPlace, Never };  // optimizer.zero_grad(true), (false), not at all

struct Case {
  std::string name;
  ddp::DDPOptions options;
  int64_t accumulate = 1;  // backward passes per step, all but the last under no_sync()
  bool clip = false;       // ddp::clip_grad_norm before each step
  bool scaler = false;     // ddp::GradScaler (loss scaling, unscale_ before the clip)
  bool bf16 = false;       // forward under bf16 autocast
  std::function<ddp::CommHook()> hook{};  // a new one per run (PowerSGD has state)
  // Whether rank r uses `extra` in step s; every rank every step without find_unused_parameters.
  std::function<bool(int64_t s, int r)> uses_extra = [](int64_t, int) { return true; };
};

struct Result {
  std::vector<torch::Tensor> losses, grads, norms;  // per step; grads flattened, 0 if undefined
  torch::Tensor weights;
  Layout first_layout, last_layout;
  bool views = true;  // after every synchronised backward, grads followed the bucket layout
};

constexpr int64_t kSteps = 4, kBatch = 3;

// True when the grads of each bucket's parameters lie one after the other in one storage of
// exactly the bucket's size, in bucket order: views of that bucket and nothing else.
bool grads_are_bucket_views(const std::vector<torch::Tensor>& params, const Layout& layout) {
  for (const auto& bucket : layout) {
    int64_t bytes = 0;
    for (size_t i : bucket)
      bytes += params[i].numel() * static_cast<int64_t>(params[i].element_size());
    const torch::Tensor& first = params[bucket.front()].grad();
    if (!first.defined() || static_cast<int64_t>(first.storage().nbytes()) != bytes) return false;
    const char* at = static_cast<const char*>(first.storage().data());
    for (size_t i : bucket) {
      const torch::Tensor& g = params[i].grad();
      if (!g.defined() || !g.is_contiguous() || !g.is_alias_of(first) ||
          static_cast<const char*>(g.data_ptr()) != at) {
        return false;
      }
      at += g.numel() * g.element_size();
    }
  }
  return true;
}

Result run(const Case& s, bool view, Zero zero) {
  const int w = rt().world_size(), r = rt().rank();
  torch::manual_seed(41);
  auto net = std::make_shared<Net>();
  ddp::DDPOptions options = s.options;
  options.reducer_at_one_rank = true;  // one rank runs the bucket path too
  options.gradient_as_bucket_view = view;
  ddp::DistributedDataParallel model(pg(), net, options);
  if (s.hook) model.register_comm_hook(s.hook());
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::optional<ddp::GradScaler> scaler;
  if (s.scaler) scaler.emplace(&pg().cpu(), ddp::GradScalerOptions{1024.0, 2.0, 0.5, 1, true});
  torch::manual_seed(42);
  const int64_t passes = kSteps * s.accumulate;
  const torch::Tensor x = torch::randn({passes, w * kBatch, 3, 8, 8});
  const torch::Tensor y = torch::randint(0, 10, {passes, w * kBatch}, torch::kLong);
  const auto params = net->parameters();
  auto flat_grads = [&] {
    std::vector<torch::Tensor> parts;
    for (const auto& p : params) {
      parts.push_back(p.grad().defined() ? p.grad().flatten().clone() : torch::zeros({1}));
    }
    return torch::cat(parts);
  };
  Result out;
  out.first_layout = model.bucket_layout();
  for (int64_t step = 0; step < kSteps; ++step) {
    if (zero != Zero::Never) optimizer.zero_grad(zero == Zero::Reset);
    torch::Tensor loss_sum = torch::zeros({});
    for (int64_t pass = 0; pass < s.accumulate; ++pass) {
      const int64_t k = step * s.accumulate + pass;
      const torch::Tensor mine = x[k].slice(0, r * kBatch, (r + 1) * kBatch);
      torch::Tensor loss;
      {
        std::optional<ddp::Autocast> autocast;
        if (s.bf16) autocast.emplace(torch::kCPU, torch::kBFloat16);
        const bool extra = s.uses_extra(step, r);
        loss = torch::nll_loss(model.forward(mine, extra),
                               y[k].slice(0, r * kBatch, (r + 1) * kBatch));
      }
      loss_sum += loss.detach();
      if (s.accumulate > 1) loss = loss / static_cast<double>(s.accumulate);
      if (scaler) loss = scaler->scale(loss);
      std::optional<ddp::DistributedDataParallel::NoSync> no_sync;
      if (pass + 1 < s.accumulate) no_sync.emplace(model);
      loss.backward();
    }
    out.losses.push_back(loss_sum);
    // A parameter that no rank used keeps its grad() apart from the bucket, by design.
    bool any_uses_extra = false;
    for (int k = 0; k < w; ++k) any_uses_extra = any_uses_extra || s.uses_extra(step, k);
    if (view && any_uses_extra) {
      out.views = out.views && grads_are_bucket_views(params, model.bucket_layout());
    }
    double norm = 0;
    if (scaler) scaler->unscale_(optimizer);
    if (s.clip) norm = ddp::clip_grad_norm(params, 0.02);
    out.norms.push_back(torch::tensor(norm, torch::kDouble));
    out.grads.push_back(flat_grads());
    if (scaler) {
      scaler->step(optimizer);
      scaler->update();
    } else {
      optimizer.step();
    }
  }
  out.last_layout = model.bucket_layout();
  std::vector<torch::Tensor> weights;
  for (const auto& p : params) weights.push_back(p.detach().flatten());
  out.weights = torch::cat(weights);
  return out;
}

// Small caps: several buckets, regrouped by the rebuild (head, extra, conv registered; conv's
// gradients come last).
ddp::DDPOptions small_buckets() {
  ddp::DDPOptions options;
  options.first_bucket_mb = 1.0 / 1024;
  options.bucket_cap_mb = 2.0 / 1024;
  return options;
}

void expect_identical(const Result& got, const Result& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s < got.losses.size(); ++s) {
    const std::string at = what + ", step " + std::to_string(s);
    EXPECT_TRUE(torch::equal(got.losses[s], want.losses[s])) << at << ": loss";
    EXPECT_TRUE(torch::equal(got.grads[s], want.grads[s]))
        << at << ": gradients, max diff "
        << (got.grads[s] - want.grads[s]).abs().max().item<double>();
    EXPECT_TRUE(torch::equal(got.norms[s], want.norms[s])) << at << ": clip_grad_norm";
  }
  EXPECT_TRUE(torch::equal(got.weights, want.weights))
      << what << ": weights, max diff " << (got.weights - want.weights).abs().max().item<double>();
  EXPECT_EQ(got.last_layout, want.last_layout) << what;
}

// Every setup with the views and without, zeroing alike; and with the views zeroed in place (what
// they are for) against copying with grads reset (LibTorch's default), where unused parameters
// do not make the two zero_grads differ anyway.
void check(const Case& s) {
  for (Zero zero : {Zero::Reset, Zero::InPlace}) {
    const std::string what =
        s.name + (zero == Zero::Reset ? ", zero_grad reset" : ", zero_grad in place");
    const Result copied = run(s, false, zero), viewed = run(s, true, zero);
    expect_identical(viewed, copied, what);
    EXPECT_TRUE(viewed.views) << what << ": grads are not the buckets' views";
    EXPECT_TRUE(ddp_test::identical_on_all_ranks(viewed.weights)) << what << ": replicas differ";
    if (!s.options.find_unused_parameters && zero == Zero::InPlace) {
      expect_identical(viewed, run(s, false, Zero::Reset), s.name + ", in place against reset");
    }
  }
}

TEST(GradientAsBucketView, BitIdenticalToCopyingAcrossTheRebuild) {
  Case s{"rebuilt buckets", small_buckets()};
  const Result viewed = run(s, true, Zero::InPlace);
  EXPECT_NE(viewed.first_layout, viewed.last_layout) << "the rebuild should regroup the buckets";
  check(s);
  check(Case{"default buckets", {}});
  ddp::DDPOptions per_parameter;  // the benchmarks' baseline: a bucket per parameter, no rebuild
  per_parameter.bucket_cap_mb = per_parameter.first_bucket_mb = 1e-9;
  per_parameter.rebuild_buckets = false;
  check(Case{"per-parameter", per_parameter});
}

TEST(GradientAsBucketView, NoSyncAccumulationAndClipping) {
  Case s{"no_sync x3, clipped", small_buckets(), 3, true};
  check(s);
  const Result viewed = run(s, true, Zero::InPlace);
  EXPECT_GT(viewed.norms[0].item<double>(), 0.02) << "the clip should bite";
}

TEST(GradientAsBucketView, UnusedParameters) {
  ddp::DDPOptions options = small_buckets();
  options.find_unused_parameters = true;
  // Step 0: every rank uses `extra`; 1: none (its grad is kept); 2: rank 0 only; 3: every rank.
  Case s{"unused extra", options};
  s.uses_extra = [](int64_t step, int r) {
    return step == 0 || step == 3 || (step == 2 && r == 0);
  };
  check(s);
  // Never zeroed: the kept grad is the accumulated one, and accumulation continues on it.
  expect_identical(run(s, true, Zero::Never), run(s, false, Zero::Never),
                   "unused extra, never zeroed");
}

TEST(GradientAsBucketView, CommHooksAndMixedPrecision) {
  Case fp16{"fp16 compression", small_buckets()};
  fp16.hook = ddp::fp16_compress_hook;
  check(fp16);
  Case powersgd{"PowerSGD", small_buckets()};
  powersgd.hook = [] {
    auto state = std::make_shared<ddp::PowerSGDState>();
    state->start_powerSGD_iter = 2;
    return ddp::powersgd_hook(state);
  };
  check(powersgd);
  Case scaled{"loss scaling, clipped", small_buckets(), 1, true, true};
  check(scaled);
  Case bf16{"bf16 autocast, no_sync x2", small_buckets(), 2};
  bf16.bf16 = true;
  check(bf16);
}

// zero_grad() on views: LibTorch's Optimizer::zero_grad detach_()es every grad, which an autograd
// view would refuse ("Can't detach views in-place"); Module::zero_grad replaces it by an alias.
TEST(GradientAsBucketView, ZeroGradKeepsTheViews) {
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  ddp::DDPOptions options = small_buckets();
  options.reducer_at_one_rank = true;
  options.gradient_as_bucket_view = true;
  ddp::DistributedDataParallel model(pg(), net, options);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  const auto params = net->parameters();
  for (int i = 0; i < 2; ++i) {
    model.forward(x, true).sum().backward();
    ASSERT_TRUE(grads_are_bucket_views(params, model.bucket_layout())) << "backward " << i;
    if (i == 0) {
      optimizer.zero_grad(false);
    } else {
      net->zero_grad(false);
    }
    EXPECT_TRUE(grads_are_bucket_views(params, model.bucket_layout())) << "zero_grad " << i;
    for (const auto& p : params) EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f);
  }
  optimizer.zero_grad();  // reset: the next backward copies and points them at the buckets again
  for (const auto& p : params) EXPECT_FALSE(p.grad().defined());
  model.forward(x, true).sum().backward();
  EXPECT_TRUE(grads_are_bucket_views(params, model.bucket_layout()));
}

}  // namespace test_bucket_view

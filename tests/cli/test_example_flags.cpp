// The training flags' checks (ddp::cli, <ddp/cli/training_flags.h>), one bad value per numeric
// flag: each is refused naming the flag and the value, before any data is read.
#include <ddp/cli/flag_checks.h>
#include <ddp/cli/training_flags.h>
#include <ddp/train/data_source.h>

#include <boost/program_options.hpp>
#include <gtest/gtest.h>

#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace {

using ddp::cli::require_at_least;
using ddp::cli::require_finite;
using ddp::cli::TrainingFlags;

TrainingFlags good() {
  TrainingFlags f;
  f.batch_size = 64, f.test_batch_size = 1000, f.epochs = 14, f.log_interval = 10, f.seed = 1;
  f.lr = 1.0, f.bucket_mb = 25, f.first_bucket_mb = 1;
  f.keep_checkpoints = 3;
  f.amp = "off", f.schedule = "step";
  return f;
}

std::string error_of(const std::function<void(TrainingFlags&)>& change) {
  TrainingFlags f = good();
  change(f);
  try {
    ddp::cli::check_training_flags(f);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

const double nan = std::numeric_limits<double>::quiet_NaN();
const double inf = std::numeric_limits<double>::infinity();

TEST(ExampleFlags, GoodFlagsPass) {
  EXPECT_EQ(error_of([](TrainingFlags&) {}), "");
}

TEST(ExampleFlags, EveryNumericFlagIsCheckedNamingIt) {
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.batch_size = 0; }),
            "--batch-size must be >= 1 (got 0)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.test_batch_size = -5; }),
            "--test-batch-size must be >= 1 (got -5)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.epochs = 0; }), "--epochs must be >= 1 (got 0)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.epochs = -2; }), "--epochs must be >= 1 (got -2)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.lr = nan; }),
            "--lr must be a finite number > 0 (got nan)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.lr = inf; }),
            "--lr must be a finite number > 0 (got inf)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.lr = 0; }),
            "--lr must be a finite number > 0 (got 0)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.seed = -1; }), "--seed must be >= 0 (got -1)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.limit_train_batches = -1; }),
            "--limit-train-batches must be >= 0 (got -1)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.bucket_mb = nan; }),
            "--bucket-mb must be a finite number > 0 (got nan)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.first_bucket_mb = -1; }),
            "--first-bucket-mb must be a finite number > 0 (got -1)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.keep_checkpoints = -1; }),
            "--keep-checkpoints must be >= 0 (got -1)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.log_interval = -1; }),
            "--log-interval must be >= 0 (got -1)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.check_sync_every = -3; }),
            "--check-sync-every must be >= 0 (got -3)");
}

TEST(ExampleFlags, TrainingStepFlagsAreChecked) {
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.accumulate = 0; }),
            "--accumulate must be >= 1 (got 0)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.warmup_steps = -1; }),
            "--warmup-steps must be >= 0 (got -1)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.scale_lr_with_batch = -1; }),
            "--scale-lr-with-batch must be >= 0 (got -1)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.clip_grad_norm = nan; }),
            "--clip-grad-norm must be a finite number >= 0 (got nan)");
  // Issue 26: beyond a float, LibTorch failed at the first step naming no flag.
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.lr = 1e39; }),
            "--lr must be at most 3.40282e+38, the largest float the optimizer holds (got 1e+39)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.clip_grad_norm = 1e39; }),
            "--clip-grad-norm must be at most 3.40282e+38, the largest float the optimizer holds "
            "(got 1e+39)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.lr = 3e38; }), "");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.on_nonfinite = "ignore"; }),
            "--on-nonfinite: 'ignore' is not one of: stop, skip");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.max_skipped_steps = 0; }),
            "--max-skipped-steps must be >= 1 (got 0)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.amp = "fp8"; }),
            "--amp: mixed precision 'fp8': expected off, bf16 or fp16");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.progress = "off"; }),
            "--progress: progress mode 'off': expected auto, bar, log or none");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.backend = "gloo"; }),
            "--backend: unknown backend 'gloo' (expected auto, mpi or nccl)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.schedule = "linear"; }),
            "--schedule 'linear' is not one of: cosine, step");
  EXPECT_EQ(error_of([](TrainingFlags& f) {
              f.accumulate = 4, f.warmup_steps = 10, f.clip_grad_norm = 1, f.amp = "bf16",
              f.schedule = "cosine";
            }),
            "");
  // --overlap-step leaves no place between the all-reduce and the step.
  const std::string overlap =
      "--overlap-step steps the optimizer inside backward, bucket by bucket: "
      "not with --clip-grad-norm, --amp fp16 or --on-nonfinite skip, which "
      "need every gradient before the step";
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.overlap_step = true, f.clip_grad_norm = 1; }),
            overlap);
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.overlap_step = true, f.amp = "fp16"; }), overlap);
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.overlap_step = true, f.on_nonfinite = "skip"; }),
            overlap);
  EXPECT_EQ(error_of([](TrainingFlags& f) {
              f.overlap_step = true, f.amp = "bf16", f.comm_hook = "powersgd";
            }),
            "");
}

// --scale-lr-with-batch REFERENCE: --lr x (batch x ranks x accumulate) / REFERENCE, the base of
// either schedule (per epoch, or per step with --warmup-steps).
TEST(ExampleFlags, ScaleLrWithBatchScalesTheBaseOfEitherSchedule) {
  for (const int64_t warmup : {0, 5}) {
    TrainingFlags f = good();
    f.batch_size = 32, f.accumulate = 2, f.warmup_steps = warmup, f.scale_lr_with_batch = 128;
    torch::Tensor w = torch::zeros({2}, torch::requires_grad());
    torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
    const ddp::cli::Schedules s =
        ddp::cli::make_schedules(f, sgd, /*train_size=*/1000, /*world_size=*/4, 1, 0.7);
    // 32 x 4 ranks x 2 = 256 = 2 x 128.
    if (warmup == 0) {
      ASSERT_TRUE(s.per_epoch);
      EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.2);
    } else {
      ASSERT_TRUE(s.per_step);
      EXPECT_DOUBLE_EQ(s.per_step->base_lrs()[0], 0.2);
    }
    f.scale_lr_with_batch = 0;  // off: the rate stays
    torch::optim::SGD plain({w}, torch::optim::SGDOptions(0.1));
    ddp::cli::make_schedules(f, plain, 1000, 4, 1, 0.7);
    EXPECT_DOUBLE_EQ(warmup == 0 ? plain.param_groups()[0].options().get_lr() : 0.1, 0.1);
  }
}

TEST(ExampleFlags, ResumeFlagsMustComeTogether) {
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.resume = "latest"; }),
            "--resume without a path needs --checkpoint-dir to search");
  EXPECT_NE(error_of([](TrainingFlags& f) {
              f.resume_fallback = true;
            }).find("--resume-fallback needs --resume (without a path)"),
            std::string::npos);
  EXPECT_EQ(error_of([](TrainingFlags& f) {
              f.resume = "latest", f.checkpoint_dir = "ckpt", f.resume_fallback = true;
            }),
            "");
  EXPECT_NE(error_of([](TrainingFlags& f) {
              f.keep_global_batch = true;
            }).find("--keep-global-batch needs --resume"),
            std::string::npos);
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.resume = "a.pt", f.keep_global_batch = true; }), "");
  TrainingFlags flags = good();
  flags.progress = "none";
  flags.resume = "a.pt";
  flags.keep_global_batch = true;
  EXPECT_TRUE(ddp::cli::trainer_options(flags, nullptr).keep_global_batch);
  // A hand-written loop's Checkpointer takes .checkpoint as it is (docs/training_loop.md).
  const ddp::CheckpointerOptions checkpoint = ddp::cli::trainer_options(flags, nullptr).checkpoint;
  EXPECT_EQ(checkpoint.resume, "a.pt");
  EXPECT_EQ(checkpoint.seed, 1);
  EXPECT_EQ(checkpoint.batch_size, 64);
}

TEST(ExampleFlags, CheckpointEverySecondsIsFinitePositiveAndNeedsAFolder) {
  EXPECT_EQ(error_of([](TrainingFlags& f) {
              f.checkpoint_every_seconds = 0.5, f.checkpoint_dir = "ckpt";
            }),
            "");
  EXPECT_EQ(
      error_of([](TrainingFlags& f) { f.checkpoint_every_seconds = 0, f.checkpoint_dir = "ckpt"; }),
      "--checkpoint-every-seconds must be a finite number > 0 (got 0)");
  EXPECT_EQ(error_of([](TrainingFlags& f) {
              f.checkpoint_every_seconds = -1, f.checkpoint_dir = "ckpt";
            }),
            "--checkpoint-every-seconds must be a finite number > 0 (got -1)");
  EXPECT_EQ(error_of([](TrainingFlags& f) {
              f.checkpoint_every_seconds = nan, f.checkpoint_dir = "ckpt";
            }),
            "--checkpoint-every-seconds must be a finite number > 0 (got nan)");
  EXPECT_EQ(error_of([](TrainingFlags& f) {
              f.checkpoint_every_seconds = inf, f.checkpoint_dir = "ckpt";
            }),
            "--checkpoint-every-seconds must be a finite number > 0 (got inf)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.checkpoint_every_seconds = 60; }),
            "--checkpoint-every-seconds needs --checkpoint-dir to write to");
  // The library's option follows the flag (0: none).
  TrainingFlags f = good();
  f.progress = "none";
  EXPECT_EQ(ddp::cli::trainer_options(f, nullptr).checkpoint.every_seconds, 0);
  f.checkpoint_every_seconds = 2.5, f.checkpoint_dir = "ckpt";
  EXPECT_EQ(ddp::cli::trainer_options(f, nullptr).checkpoint.every_seconds, 2.5);
}

// --gradient-as-bucket-view: parsed as a switch, and DDPOptions follows it (off by default, as in
// PyTorch).
TEST(ExampleFlags, GradientAsBucketViewReachesDDPOptions) {
  for (const bool on : {false, true}) {
    TrainingFlags f;
    boost::program_options::options_description options;
    ddp::cli::add_training_flags(options, f, {64, 1, 1.0, "data", "data", "model.pt"});
    std::vector<const char*> argv = {"program"};
    if (on) argv.push_back("--gradient-as-bucket-view");
    boost::program_options::variables_map vm;
    boost::program_options::store(boost::program_options::parse_command_line(
                                      static_cast<int>(argv.size()), argv.data(), options),
                                  vm);
    boost::program_options::notify(vm);
    EXPECT_EQ(f.gradient_as_bucket_view, on);
    EXPECT_EQ(ddp::cli::ddp_options(f, nullptr).gradient_as_bucket_view, on);
  }
}

// Issue 60: --workers 100000 spent half a minute creating threads, then failed naming nothing.
TEST(ExampleFlags, LoaderWorkersAreBounded) {
  EXPECT_NO_THROW(ddp::check_loader_workers("--workers", 0));
  EXPECT_NO_THROW(ddp::check_loader_workers("--workers", ddp::kMaxLoaderWorkers));
  for (const int64_t workers : {ddp::kMaxLoaderWorkers + 1, int64_t{100000}, int64_t{-1}}) {
    try {
      ddp::check_loader_workers("--workers", workers);
      ADD_FAILURE() << workers << " workers passed";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "--workers must be from 0 to 1024 worker threads (got " + std::to_string(workers) +
                    "): the DataLoader starts them all with each pass, and a few per core keep a "
                    "rank fed");
    }
  }
}

TEST(ExampleFlags, ProgramFlagHelpers) {
  EXPECT_THROW(require_finite("--gamma", nan, 0, true), std::invalid_argument);
  EXPECT_THROW(require_finite("--momentum", -0.1, 0, true), std::invalid_argument);
  EXPECT_NO_THROW(require_finite("--momentum", 0, 0, true));
  EXPECT_THROW(require_finite("--weight-decay", inf, 0, true), std::invalid_argument);
  EXPECT_THROW(require_at_least("--step-size", 0, 1), std::invalid_argument);
  try {
    require_finite("--gamma", nan, 0, true);
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "--gamma must be a finite number >= 0 (got nan)");
  }
}

}  // namespace

TEST(ExampleFlags, TimeoutIsWholePositiveAndBounded) {
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.timeout = 5; }), "");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.timeout = 1; }), "");
  // Issue 60: 0.3 silently became 1 s (rounded up); the watchdogs count whole seconds.
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.timeout = 0.3; }),
            "--timeout must be a whole number of seconds (got 0.3): the watchdogs count whole "
            "seconds");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.timeout = 2.5; }),
            "--timeout must be a whole number of seconds (got 2.5): the watchdogs count whole "
            "seconds");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.timeout = 0; }),
            "--timeout must be a finite number > 0 (got 0)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.timeout = -3; }),
            "--timeout must be a finite number > 0 (got -3)");
  EXPECT_EQ(
      error_of([](TrainingFlags& f) { f.timeout = std::numeric_limits<double>::quiet_NaN(); }),
      "--timeout must be a finite number > 0 (got nan)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.timeout = std::numeric_limits<double>::infinity(); }),
            "--timeout must be a finite number > 0 (got inf)");
  EXPECT_EQ(error_of([](TrainingFlags& f) { f.timeout = 2e7; }),
            "--timeout must be at most 10000000 seconds (got 2e+07)");
}

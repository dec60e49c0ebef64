#include <ddp/cli/training_flags.h>

#include <ddp/cli/flag_checks.h>
#include <ddp/train/autocast.h>
#include <ddp/train/lr_scheduler.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/comm_hook.h>
#include <ddp/train/progress.h>
#include <ddp/train/step_boundary.h>
#include <ddp/distributed_sampler.h>

#include "cli/number_text.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace po = boost::program_options;

namespace ddp::cli {

namespace {

// A notifier for a folder flag: given, it must name one. Without it `--checkpoint-dir ""` (an
// unset shell variable) would silently mean "no checkpoints", and a long run would save nothing.
std::function<void(const std::string&)> require_folder_name(const std::string& flag) {
  return [flag](const std::string& value) {
    if (value.empty()) {
      throw std::invalid_argument(flag +
                                  " must name a folder (got an empty string); leave the "
                                  "flag out for none");
    }
  };
}

// `value` when it is one of `choices`, else std::invalid_argument "<flag> '<value>' is not one
// of: <choices>".
const std::string& one_of(const char* flag, const std::string& value,
                          std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* choice : choices) {
    if (value == choice) return value;
    list += (list.empty() ? "" : ", ") + std::string(choice);
  }
  throw std::invalid_argument(std::string(flag) + " '" + value + "' is not one of: " + list);
}

// parse(value), its std::invalid_argument prefixed with "<flag>: ".
template <typename Parse>
auto parse_flag(const char* flag, const std::string& value, Parse parse) {
  try {
    return parse(value);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(flag) + ": " + e.what());
  }
}

// --hierarchical's value as the option; another name throws naming the flag.
ddp::HierarchicalAllReduce hierarchical_choice(const std::string& value) {
  const std::string& name = one_of("--hierarchical", value, {"auto", "on", "off"});
  if (name == "auto") return ddp::HierarchicalAllReduce::Auto;
  return name == "on" ? ddp::HierarchicalAllReduce::On : ddp::HierarchicalAllReduce::Off;
}

}  // namespace

void check_training_flags(const TrainingFlags& f) {
  require_at_least("--batch-size", f.batch_size, 1);
  require_at_least("--test-batch-size", f.test_batch_size, 1);
  require_at_least("--epochs", f.epochs, 1);
  require_finite("--lr", f.lr, 0, /*least_allowed=*/false);
  require_float_range("--lr", f.lr);
  require_at_least("--seed", f.seed, 0);
  require_at_least("--limit-train-batches", f.limit_train_batches, 0);
  require_finite("--bucket-mb", f.bucket_mb, 0, false);
  require_finite("--first-bucket-mb", f.first_bucket_mb, 0, false);
  require_at_least("--keep-checkpoints", f.keep_checkpoints, 0);
  require_at_least("--log-interval", f.log_interval, 0);
  require_at_least("--check-sync-every", f.check_sync_every, 0);
  require_at_least("--checkpoint-every-steps", f.checkpoint_every_steps, 0);
  require_at_least("--accumulate", f.accumulate, 1);
  require_at_least("--warmup-steps", f.warmup_steps, 0);
  require_at_least("--scale-lr-with-batch", f.scale_lr_with_batch, 0);
  require_finite("--clip-grad-norm", f.clip_grad_norm, 0, /*least_allowed=*/true);
  require_float_range("--clip-grad-norm", f.clip_grad_norm);
  parse_flag("--on-nonfinite", f.on_nonfinite, ddp::parse_on_nonfinite);
  require_at_least("--max-skipped-steps", f.max_skipped_steps, 1);
  parse_flag("--amp", f.amp, ddp::parse_amp_mode);
  parse_flag("--progress", f.progress, ddp::parse_progress_mode);
  parse_flag("--backend", f.backend, ddp::parse_backend);
  one_of("--comm-hook", f.comm_hook, {"allreduce", "fp16", "bf16", "powersgd"});
  if (f.overlap_step && (f.clip_grad_norm > 0 || f.amp == "fp16" || f.on_nonfinite == "skip")) {
    throw std::invalid_argument(
        "--overlap-step steps the optimizer inside backward, bucket by "
        "bucket: not with --clip-grad-norm, --amp fp16 or --on-nonfinite "
        "skip, which need every gradient before the step");
  }
  (void)hierarchical_choice(f.hierarchical);
  require_at_least("--powersgd-rank", f.powersgd_rank, 1);
  // PyTorch's rule: the buckets are regrouped after the first step, which would mix up the
  // per-bucket error feedback and warm start.
  require_at_least("--powersgd-start-iter", f.powersgd_start_iter, 2);
  one_of("--schedule", f.schedule, {"cosine", "step"});
  if (f.timeout) {
    require_finite("--timeout", *f.timeout, 0, /*least_allowed=*/false);
    if (*f.timeout > 1e7) {
      throw std::invalid_argument("--timeout must be at most 10000000 seconds (got " +
                                  short_text(*f.timeout) + ")");
    }
    // The watchdogs count whole seconds (ProcessGroupOptions::timeout, as DDP_TIMEOUT_SECONDS):
    // a fraction would be rounded to another limit than the one asked for.
    if (*f.timeout != std::floor(*f.timeout)) {
      throw std::invalid_argument("--timeout must be a whole number of seconds (got " +
                                  short_text(*f.timeout) + "): the watchdogs count whole seconds");
    }
  }
  if (f.checkpoint_every_steps > 0 && f.checkpoint_dir.empty()) {
    throw std::invalid_argument("--checkpoint-every-steps needs --checkpoint-dir to write to");
  }
  if (f.checkpoint_every_seconds) {
    require_finite("--checkpoint-every-seconds", *f.checkpoint_every_seconds, 0,
                   /*least_allowed=*/false);
    if (f.checkpoint_dir.empty()) {
      throw std::invalid_argument("--checkpoint-every-seconds needs --checkpoint-dir to write to");
    }
  }
  if (f.resume == "latest" && f.checkpoint_dir.empty()) {
    throw std::invalid_argument("--resume without a path needs --checkpoint-dir to search");
  }
  if (f.keep_global_batch && f.resume.empty()) {
    throw std::invalid_argument(
        "--keep-global-batch needs --resume: it keeps the global batch of the snapshot the run "
        "resumes from");
  }
  if (f.resume_fallback && f.resume != "latest") {
    throw std::invalid_argument(
        "--resume-fallback needs --resume (without a path): it skips an unreadable newest "
        "snapshot of --checkpoint-dir for the previous one");
  }
}

void add_training_flags(po::options_description& d, TrainingFlags& f,
                        const TrainingDefaults& defaults) {
  d.add_options()("help,h", "print this help and exit");
  // One flag a line (clang-format would pack the chain).
  // clang-format off
  po::options_description training("Training");
  training.add_options()
    ("batch-size", po::value(&f.batch_size)->default_value(defaults.batch_size), "input batch size for training, per rank")
    ("test-batch-size", po::value(&f.test_batch_size)->default_value(1000), "input batch size for testing")
    ("epochs", po::value(&f.epochs)->default_value(defaults.epochs), "number of epochs to train")
    ("lr", po::value(&f.lr)->default_value(defaults.lr, short_text(defaults.lr)), "learning rate")
    ("seed", po::value(&f.seed)->default_value(1), "random seed (model init, data order, augmentation)")
    ("no-cuda", po::bool_switch(&f.no_cuda), "train on the CPU even when CUDA is available")
    ("deterministic", po::bool_switch(&f.deterministic), "deterministic GPU kernels: the same run twice gives the same model (slower)")
    ("dry-run", po::bool_switch(&f.dry_run), "quickly check a single pass: one batch, one epoch")
    ("limit-train-batches", po::value(&f.limit_train_batches)->default_value(0), "train on at most N batches per epoch (0: all)")
    ("schedule", po::value(&f.schedule)->default_value(defaults.schedule), "learning rate schedule: cosine (down to 0 over --epochs) or step")
    ("warmup-steps", po::value(&f.warmup_steps)->default_value(0), "linear learning-rate warmup over N optimizer steps, then --schedule per step instead of per epoch (0: none, per epoch)")
    ("scale-lr-with-batch", po::value(&f.scale_lr_with_batch)->value_name("REFERENCE")->default_value(0), "linear scaling rule: --lr is for a global batch of REFERENCE samples; use --lr x (batch-size x ranks x accumulate) / REFERENCE (0: off)")
    ("accumulate", po::value(&f.accumulate)->default_value(1), "micro-batches of --batch-size per optimizer step, accumulated without gradient sync (no_sync)")
    ("clip-grad-norm", po::value(&f.clip_grad_norm)->default_value(0.0, "0"), "clip the gradients to this global 2-norm before each step (0: no clipping)")
    ("amp", po::value(&f.amp)->default_value("off"), "mixed precision of forward and loss: off, bf16 (autocast), or fp16 (autocast and loss scaling)")
    ("on-nonfinite", po::value(&f.on_nonfinite)->default_value("stop"), "a step whose gradients are NaN or inf: stop (exit status 3, nothing non-finite saved) or skip (drop the step, as fp16 loss scaling does; a NaN loss still stops)")
    ("max-skipped-steps", po::value(&f.max_skipped_steps)->default_value(10), "with --on-nonfinite skip: stop after this many dropped steps in a row");
  po::options_description data("Data");
  data.add_options()
    ("data-dir", po::value(&f.data_dir)->default_value(defaults.data_dir), defaults.data_help.c_str());
  po::options_description distributed("Distributed");
  distributed.add_options()
    ("bucket-mb", po::value(&f.bucket_mb)->default_value(25.0), "gradient bucket cap in MiB")
    ("first-bucket-mb", po::value(&f.first_bucket_mb)->default_value(1.0), "first gradient bucket cap in MiB")
    ("comm-hook", po::value(&f.comm_hook)->default_value("allreduce"), "what reduces each gradient bucket: allreduce (the average), fp16 or bf16 (the average sent as half or bfloat16), or powersgd (low-rank compression with error feedback, as PyTorch's powerSGD_hook)")
    ("powersgd-rank", po::value(&f.powersgd_rank)->default_value(1), "with --comm-hook powersgd: the rank of the gradient approximation (PowerSGDState::matrix_approximation_rank)")
    ("powersgd-start-iter", po::value(&f.powersgd_start_iter)->default_value(1000), "with --comm-hook powersgd: plain all-reduce for the first N steps, compression after (>= 2)")
    ("backend", po::value(&f.backend)->default_value("auto"), "gradient all-reduce backend: auto (NCCL for a model on a GPU, else MPI), mpi or nccl")
    ("find-unused-parameters", po::bool_switch(&f.find_unused_parameters), "count parameters without a gradient as zero instead of failing")
    ("gradient-as-bucket-view", po::bool_switch(&f.gradient_as_bucket_view), "gradients are views into the all-reduce buckets: no copy into the buckets and back, no gradient memory of their own (same results)")
    ("overlap-step", po::bool_switch(&f.overlap_step), "the optimizer steps each gradient bucket inside backward as soon as its all-reduce is done (same results; not with --clip-grad-norm, --amp fp16 or --on-nonfinite skip, which need every gradient first)")
    ("no-broadcast-buffers", po::bool_switch(&f.no_broadcast_buffers), "do not broadcast rank 0's buffers (BatchNorm statistics) before each forward")
    ("hierarchical", po::value(&f.hierarchical)->default_value("auto"), "CPU all-reduces through one leader per host (reduce on the host, all-reduce among the hosts, broadcast on the host): auto (with several hosts and several ranks on some host), on or off")
    ("timeout", po::value<double>()->value_name("SECONDS")->notifier([&f](double seconds) { f.timeout = seconds; }),
     "end the job when a collective (MPI or NCCL) is unfinished after this many seconds, naming it and the ranks that never arrived, or a wait outside one (MPI start-up, building a communicator, loading data, ...), naming it (whole seconds; default: DDP_TIMEOUT_SECONDS, else 600; MPI start-up without --timeout: DDP_STARTUP_TIMEOUT_SECONDS, else 600)");
  po::options_description checkpoints("Checkpoints");
  checkpoints.add_options()
    ("save-model", po::bool_switch(&f.save_model), ("save the trained model to " + defaults.model_file).c_str())
    ("checkpoint-dir", po::value(&f.checkpoint_dir)->notifier(require_folder_name("--checkpoint-dir")), "write model_with_epoch<N>.pt and a training snapshot here at every epoch end")
    ("keep-checkpoints", po::value(&f.keep_checkpoints)->default_value(3), "keep the newest N epochs of checkpoints (0: all)")
    ("checkpoint-every-steps", po::value(&f.checkpoint_every_steps)->default_value(0), "also write a training snapshot every N steps inside an epoch, keeping the newest (0: epoch ends only)")
    ("checkpoint-every-seconds", po::value<double>()->value_name("SECONDS")->notifier([&f](double seconds) { f.checkpoint_every_seconds = seconds; }), "also write a training snapshot inside an epoch once SECONDS have passed since the last one, keeping the newest")
    ("resume", po::value(&f.resume)->implicit_value("latest")->default_value(""), "continue from the newest snapshot in --checkpoint-dir (--resume) or from a given one (--resume=PATH)")
    ("resume-fallback", po::bool_switch(&f.resume_fallback), "with --resume: skip an unreadable newest snapshot for the previous one")
    ("keep-global-batch", po::bool_switch(&f.keep_global_batch), "with --resume on another number of ranks: per-rank batch = the snapshot's global batch / ranks, so training continues on the same global batches (refused when it does not divide); without it --batch-size stays per rank");
  po::options_description diagnostics("Progress and diagnostics");
  diagnostics.add_options()
    ("log-interval", po::value(&f.log_interval)->default_value(10), "how many batches to wait before logging training status")
    ("progress", po::value(&f.progress)->default_value("auto"), "during an epoch: bar (a live line with ETA), log (a line per --log-interval, with ETA), none, or auto (bar on a terminal, else log)")
    ("metrics-file", po::value(&f.metrics_file)->default_value(""), "write one JSON object per epoch, and a step record every --log-interval batches (loss, learning rate, gradient norm, samples/s, phase shares), to this file")
    ("tensorboard", po::value(&f.tensorboard)->value_name("DIR")->notifier(require_folder_name("--tensorboard")), "also write those numbers as TensorBoard scalars, and the training flags as its hparams, to an event file in DIR (made when missing)")
    ("show-topology", po::bool_switch(&f.show_topology), "print every rank's place (node, local rank, device)")
    ("timeline", po::value(&f.timeline)->default_value(""), "write a Chrome-trace/Perfetto JSON of every rank's steps and all-reduces to this file")
    ("check-sync-every", po::value(&f.check_sync_every)->default_value(0), "every N steps verify that all replicas are identical; stop naming the first difference (0: never)");
  // clang-format on
  d.add(training).add(data).add(distributed).add(checkpoints).add(diagnostics);
}

void use_deterministic_kernels() {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

namespace {

// --timeout in seconds (whole once check_training_flags passed; rounded up, never to 0, where
// a caller skipped the check); 0 without it. The one reading of the value, for the collectives
// (ProcessGroupOptions) and start-up (RuntimeOptions) alike.
std::chrono::seconds timeout_seconds(const TrainingFlags& flags) {
  if (!flags.timeout) return std::chrono::seconds(0);
  return std::chrono::seconds(static_cast<int64_t>(std::ceil(*flags.timeout)));
}

// The training flags that shape the trajectory, by flag name, for TensorBoard's hparams: the
// values as given or defaulted (a program's own flags are not among them).
std::vector<std::pair<std::string, std::string>> hparams(const TrainingFlags& f) {
  const auto number = [](double value) { return short_text(value); };
  const auto boolean = [](bool value) { return std::string(value ? "true" : "false"); };
  return {{"batch-size", std::to_string(f.batch_size)},
          {"epochs", std::to_string(f.epochs)},
          {"lr", number(f.lr)},
          {"schedule", f.schedule},
          {"warmup-steps", std::to_string(f.warmup_steps)},
          {"scale-lr-with-batch", std::to_string(f.scale_lr_with_batch)},
          {"accumulate", std::to_string(f.accumulate)},
          {"clip-grad-norm", number(f.clip_grad_norm)},
          {"amp", f.amp},
          {"on-nonfinite", f.on_nonfinite},
          {"seed", std::to_string(f.seed)},
          {"limit-train-batches", std::to_string(f.limit_train_batches)},
          {"comm-hook", f.comm_hook},
          {"bucket-mb", number(f.bucket_mb)},
          {"first-bucket-mb", number(f.first_bucket_mb)},
          {"gradient-as-bucket-view", boolean(f.gradient_as_bucket_view)},
          {"overlap-step", boolean(f.overlap_step)},
          {"no-broadcast-buffers", boolean(f.no_broadcast_buffers)},
          {"deterministic", boolean(f.deterministic)}};
}

}  // namespace

ddp::ProcessGroupOptions process_group_options(const TrainingFlags& flags) {
  ddp::ProcessGroupOptions options;
  options.timeout = timeout_seconds(flags);
  options.hierarchical = hierarchical_choice(flags.hierarchical);
  return options;
}

ddp::RuntimeOptions runtime_options(const TrainingFlags& flags) {
  ddp::RuntimeOptions options;
  options.use_cuda = !flags.no_cuda;
  options.startup_timeout = timeout_seconds(flags);
  return options;
}

std::unique_ptr<ddp::Timeline> make_timeline(ddp::ProcessGroup& group, const TrainingFlags& flags) {
  if (flags.timeline.empty()) return nullptr;
  return std::make_unique<ddp::Timeline>(group.cpu());
}

ddp::DDPOptions ddp_options(const TrainingFlags& flags, ddp::Timeline* timeline) {
  ddp::DDPOptions options;
  options.backend = parse_flag("--backend", flags.backend, ddp::parse_backend);
  options.bucket_cap_mb = flags.bucket_mb;
  options.first_bucket_mb = flags.first_bucket_mb;
  options.find_unused_parameters = flags.find_unused_parameters;
  options.gradient_as_bucket_view = flags.gradient_as_bucket_view;
  options.broadcast_buffers = !flags.no_broadcast_buffers;
  options.timeline = timeline;
  return options;
}

std::unique_ptr<ddp::DistributedDataParallel> make_ddp(
    ddp::ProcessGroup& group, std::shared_ptr<torch::nn::Module> model, const TrainingFlags& flags,
    Parallelism parallelism, ddp::Timeline* timeline, torch::optim::Optimizer& optimizer) {
  if (parallelism != Parallelism::DataParallel) return nullptr;
  auto ddp_model = std::make_unique<ddp::DistributedDataParallel>(group, std::move(model),
                                                                  ddp_options(flags, timeline));
  ddp::CommHook hook = ddp::allreduce_hook();
  if (flags.comm_hook == "fp16") hook = ddp::fp16_compress_hook();
  if (flags.comm_hook == "bf16") hook = ddp::bf16_compress_hook();
  if (flags.comm_hook == "powersgd") {
    auto state = std::make_shared<ddp::PowerSGDState>();
    state->matrix_approximation_rank = flags.powersgd_rank;
    state->start_powerSGD_iter = flags.powersgd_start_iter;
    hook = ddp::powersgd_hook(state);
  }
  if (flags.overlap_step) hook = ddp::hook_then_optimizer(std::move(hook), optimizer);
  ddp_model->register_comm_hook(std::move(hook));
  return ddp_model;
}

ddp::TrainerOptions trainer_options(const TrainingFlags& flags, ddp::Timeline* timeline) {
  // The Trainer checks its options too, but in its own terms: here the user hears of the flag.
  check_training_flags(flags);
  ddp::TrainerOptions options;
  options.batch_size = flags.batch_size;
  options.test_batch_size = flags.test_batch_size;
  options.limit_train_batches = flags.limit_train_batches;
  options.dry_run = flags.dry_run;
  options.seed = flags.seed;
  options.timeline = timeline;
  options.check_sync_every = flags.check_sync_every;
  options.accumulate = flags.accumulate;
  options.clip_grad_norm = flags.clip_grad_norm;
  options.amp = ddp::parse_amp_mode(flags.amp);
  options.on_nonfinite = ddp::parse_on_nonfinite(flags.on_nonfinite);
  options.max_skipped_steps = flags.max_skipped_steps;
  options.report.log_interval = flags.log_interval;
  options.report.progress = parse_flag("--progress", flags.progress, ddp::parse_progress_mode);
  options.report.metrics_file = flags.metrics_file;
  options.report.tensorboard_dir = flags.tensorboard;
  options.report.hparams = hparams(flags);
  // Complete for a hand-written loop's Checkpointer (the Trainer sets the same two itself).
  options.checkpoint.seed = flags.seed;
  options.checkpoint.batch_size = flags.batch_size;
  options.checkpoint.dir = flags.checkpoint_dir;
  options.checkpoint.keep = flags.keep_checkpoints;
  options.checkpoint.resume = flags.resume;
  options.checkpoint.fallback = flags.resume_fallback;
  options.checkpoint.every_steps = flags.checkpoint_every_steps;
  options.checkpoint.every_seconds = flags.checkpoint_every_seconds.value_or(0);
  options.keep_global_batch = flags.keep_global_batch;
  return options;
}

Schedules make_schedules(const TrainingFlags& flags, torch::optim::Optimizer& optimizer,
                         int64_t train_size, int world_size, int64_t step_size, double gamma) {
  Schedules s;
  if (flags.scale_lr_with_batch > 0) {  // before the schedules, which take the rate as their base
    ddp::scale_lr_with_batch(optimizer,
                             ddp::global_batch_size(flags.batch_size, world_size, flags.accumulate),
                             flags.scale_lr_with_batch);
  }
  if (flags.warmup_steps == 0) {
    if (flags.schedule == "cosine") {
      s.per_epoch = std::make_unique<ddp::CosineAnnealingLR>(optimizer, flags.epochs);
    } else {
      s.per_epoch =
          std::make_unique<ddp::StepLR>(optimizer, static_cast<unsigned>(step_size), gamma);
    }
    return s;
  }
  // The Trainer's count (a fresh epoch's: every rank's shard has the same size).
  const int64_t steps_per_epoch =
      ddp::epoch_length(
          ddp::DistributedSampler(train_size, world_size, 0).num_batches(flags.batch_size),
          flags.dry_run ? 1 : flags.limit_train_batches, flags.accumulate)
          .steps;
  ddp::LRScheduleOptions o;
  o.warmup_steps = flags.warmup_steps;
  if (flags.schedule == "cosine") {
    o.decay = ddp::LRDecay::Cosine;
    o.decay_steps = std::max<int64_t>(1, flags.epochs * steps_per_epoch - flags.warmup_steps);
  } else {
    o.decay = ddp::LRDecay::Step;
    o.step_size = step_size * steps_per_epoch;
    o.gamma = gamma;
  }
  s.per_step = std::make_unique<ddp::LRSchedule>(optimizer, o);
  return s;
}

}  // namespace ddp::cli

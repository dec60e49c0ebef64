#include "example_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace po = boost::program_options;

namespace {

// 0.1 as "0.1" in --help, not Boost's round-trip "0.10000000000000001".
std::string short_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

void require_at_least(const char* flag, int64_t value, int64_t least) {
  if (value >= least) return;
  throw std::invalid_argument(std::string(flag) + " must be >= " + std::to_string(least) +
                              " (got " + std::to_string(value) + ")");
}

void require_finite(const char* flag, double value, double least, bool least_allowed) {
  // Written so that NaN fails: every comparison with NaN is false.
  if (std::isfinite(value) && (value > least || (least_allowed && value == least))) return;
  throw std::invalid_argument(std::string(flag) + " must be a finite number " +
                              (least_allowed ? ">= " : "> ") + short_text(least) + " (got " +
                              short_text(value) + ")");
}

void check_common_flags(const CommonFlags& f) {
  require_at_least("--batch-size", f.batch_size, 1);
  require_at_least("--test-batch-size", f.test_batch_size, 1);
  require_at_least("--epochs", f.epochs, 1);
  require_finite("--lr", f.lr, 0, /*least_allowed=*/false);
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
  try {
    ddp::parse_amp_mode(f.amp);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--amp: ") + e.what());
  }
  if (f.schedule != "cosine" && f.schedule != "step") {
    throw std::invalid_argument("--schedule '" + f.schedule + "' is not one of: cosine, step");
  }
  require_at_least("--replicas-per-process", f.replicas_per_process, 0);
  if (f.replicas_per_process > 1024) {
    throw std::invalid_argument("--replicas-per-process must be <= 1024 (got " +
                                std::to_string(f.replicas_per_process) + ")");
  }
  if (f.timeout) {
    require_finite("--timeout", *f.timeout, 0, /*least_allowed=*/false);
    if (*f.timeout > 1e7) {
      throw std::invalid_argument("--timeout must be at most 10000000 seconds (got " +
                                  short_text(*f.timeout) + ")");
    }
  }
  if (f.checkpoint_every_steps > 0 && f.checkpoint_dir.empty()) {
    throw std::invalid_argument("--checkpoint-every-steps needs --checkpoint-dir to write to");
  }
  if (f.resume == "latest" && f.checkpoint_dir.empty()) {
    throw std::invalid_argument("--resume without a path needs --checkpoint-dir to search");
  }
  if (f.resume_fallback && f.resume != "latest") {
    throw std::invalid_argument(
        "--resume-fallback needs --resume (without a path): it skips an unreadable newest "
        "snapshot of --checkpoint-dir for the previous one");
  }
}

void add_common_flags(po::options_description& d, CommonFlags& f, const ExampleDefaults& defaults) {
  d.add_options()("help,h", "print this help and exit");
  po::options_description training("Training");
  training.add_options()
    ("batch-size", po::value(&f.batch_size)->default_value(defaults.batch_size), "input batch size for training, per rank")
    ("test-batch-size", po::value(&f.test_batch_size)->default_value(1000), "input batch size for testing")
    ("epochs", po::value(&f.epochs)->default_value(defaults.epochs), "number of epochs to train")
    ("lr", po::value(&f.lr)->default_value(defaults.lr, short_text(defaults.lr)), "learning rate")
    ("seed", po::value(&f.seed)->default_value(1), "random seed (model init, data order, augmentation)")
    ("no-cuda", po::bool_switch(&f.no_cuda), "train on the CPU even when CUDA is available")
    ("dry-run", po::bool_switch(&f.dry_run), "quickly check a single pass: one batch, one epoch")
    ("limit-train-batches", po::value(&f.limit_train_batches)->default_value(0), "train on at most N batches per epoch (0: all)")
    ("schedule", po::value(&f.schedule)->default_value(defaults.schedule), "learning rate schedule: cosine (down to 0 over --epochs) or step")
    ("warmup-steps", po::value(&f.warmup_steps)->default_value(0), "linear learning-rate warmup over N optimizer steps, then --schedule per step instead of per epoch (0: none, per epoch)")
    ("scale-lr-with-batch", po::value(&f.scale_lr_with_batch)->value_name("REFERENCE")->default_value(0), "linear scaling rule: --lr is for a global batch of REFERENCE samples; use --lr x (batch-size x ranks x accumulate) / REFERENCE (0: off)")
    ("accumulate", po::value(&f.accumulate)->default_value(1), "micro-batches of --batch-size per optimizer step, accumulated without gradient sync (no_sync)")
    ("clip-grad-norm", po::value(&f.clip_grad_norm)->default_value(0.0, "0"), "clip the gradients to this global 2-norm before each step (0: no clipping)")
    ("amp", po::value(&f.amp)->default_value("off"), "mixed precision of forward and loss: off, bf16 (autocast), or fp16 (autocast and loss scaling)");
  po::options_description data("Data");
  data.add_options()
    ("data-dir", po::value(&f.data_dir)->default_value(defaults.data_dir), defaults.data_help.c_str());
  po::options_description distributed("Distributed");
  distributed.add_options()
    ("grad-sync", po::value(&f.grad_sync)->default_value("bucketed"), "gradient sync: bucketed (overlapped with backward) or per-parameter")
    ("bucket-mb", po::value(&f.bucket_mb)->default_value(25.0), "gradient bucket cap in MiB")
    ("first-bucket-mb", po::value(&f.first_bucket_mb)->default_value(1.0), "first gradient bucket cap in MiB")
    ("compression", po::value(&f.compression)->default_value("none"), "gradients on the wire: none, fp16 or bf16")
    ("backend", po::value(&f.backend)->default_value("auto"), "gradient all-reduce backend: auto (NCCL for a model on a GPU, else MPI), mpi or nccl")
    ("find-unused-parameters", po::bool_switch(&f.find_unused_parameters), "count parameters without a gradient as zero instead of failing")
    ("no-broadcast-buffers", po::bool_switch(&f.no_broadcast_buffers), "do not broadcast rank 0's buffers (BatchNorm statistics) before each forward")
    ("replicas-per-process", po::value(&f.replicas_per_process)->default_value(0), "replicas each process trains, one thread each (0: its GPUs per local rank on a GPU, 1 on the CPU)")
    ("timeout", po::value<double>()->value_name("SECONDS")->notifier([&f](double seconds) { f.timeout = seconds; }),
     "end the job when a collective (MPI or NCCL) is unfinished after this many seconds, naming it and the ranks that never arrived (rounded up to whole seconds; default: DDP_TIMEOUT_SECONDS, else 600)");
  po::options_description checkpoints("Checkpoints");
  checkpoints.add_options()
    ("save-model", po::bool_switch(&f.save_model), ("save the trained model to " + defaults.model_file).c_str())
    ("checkpoint-dir", po::value(&f.checkpoint_dir)->default_value(""), "write model_with_epoch<N>.pt and a training snapshot here at every epoch end")
    ("keep-checkpoints", po::value(&f.keep_checkpoints)->default_value(3), "keep the newest N epochs of checkpoints (0: all)")
    ("checkpoint-every-steps", po::value(&f.checkpoint_every_steps)->default_value(0), "also write a training snapshot every N steps inside an epoch, keeping the newest (0: epoch ends only)")
    ("resume", po::value(&f.resume)->implicit_value("latest")->default_value(""), "continue from the newest snapshot in --checkpoint-dir (--resume) or from a given one (--resume=PATH)")
    ("resume-fallback", po::bool_switch(&f.resume_fallback), "with --resume: skip an unreadable newest snapshot for the previous one");
  po::options_description diagnostics("Progress and diagnostics");
  diagnostics.add_options()
    ("log-interval", po::value(&f.log_interval)->default_value(10), "how many batches to wait before logging training status")
    ("progress", po::value(&f.progress)->default_value("auto"), "during an epoch: bar (a live line with ETA), log (a line per --log-interval, with ETA), none, or auto (bar on a terminal, else log)")
    ("metrics-file", po::value(&f.metrics_file)->default_value(""), "append one JSON object per epoch to this file")
    ("show-topology", po::bool_switch(&f.show_topology), "print every rank's place (node, local rank, device)")
    ("timeline", po::value(&f.timeline)->default_value(""), "write a Chrome-trace/Perfetto JSON of every rank's steps and all-reduces to this file")
    ("check-sync-every", po::value(&f.check_sync_every)->default_value(0), "every N steps verify that all replicas are identical; stop naming the first difference (0: never)");
  d.add(training).add(data).add(distributed).add(checkpoints).add(diagnostics);
}

int run_example(int argc, char** argv, const std::string& name, const std::string& usage,
                Parallelism parallelism, const po::options_description& options,
                const CommonFlags& flags, const std::function<int(ddp::ProcessGroup&)>& train,
                const std::function<void()>& check_flags) {
  // Flags first: they decide the device the Runtime picks. Their values are checked here too,
  // before any data is read, so a bad value costs no time.
  po::variables_map vm;
  std::string flag_error;
  try {
    po::store(po::parse_command_line(argc, argv, options), vm);
    po::notify(vm);
    if (!vm.count("help")) {
      check_common_flags(flags);
      if (check_flags) check_flags();
    }
  } catch (const po::error& e) {
    flag_error = e.what();
  } catch (const std::invalid_argument& e) {
    flag_error = e.what();
  }
  ddp::RuntimeOptions runtime_options;
  runtime_options.use_cuda = flag_error.empty() && !flags.no_cuda;
  runtime_options.print_banner = flag_error.empty();  // a bad flag: only the message
  if (flag_error.empty()) runtime_options.replicas_per_process = static_cast<int>(flags.replicas_per_process);
  ddp::Runtime runtime(argc, argv, runtime_options);
  if (!flag_error.empty()) {
    // Every rank sees the same flags, so every rank stops here; rank 0 explains.
    if (runtime.is_main()) std::cerr << name << ": " << flag_error << " (see --help)\n";
    return 2;
  }
  if (vm.count("help")) {
    if (runtime.is_main()) {
      std::cout << "Usage: " << (parallelism == Parallelism::DataParallel ? "mpirun -np N " : "")
                << name << " [options]\n" << usage << "\n\n" << options << "\n";
    }
    return 0;
  }
  int status = 0;
  const int aborted = ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroupOptions group_options;
    if (flags.timeout) {
      group_options.timeout = std::chrono::seconds(static_cast<int64_t>(std::ceil(*flags.timeout)));
    }
    if (parallelism == Parallelism::SingleProcess && runtime.world_size() > 1) {
      throw std::runtime_error(name + " trains in one process but was started as " +
                               std::to_string(runtime.world_size()) + " ranks: use ddp_" + name +
                               " for data-parallel training");
    }
    if (parallelism == Parallelism::SingleProcess && runtime.replicas_per_process() > 1) {
      throw std::runtime_error(name + " trains one replica but --replicas-per-process is " +
                               std::to_string(runtime.replicas_per_process()) + ": use ddp_" +
                               name + " for data-parallel training");
    }
    status = ddp::run_replicas(runtime, [&](ddp::ProcessGroup& group) {
      if (flags.show_topology) {
        std::string place = runtime.summary();
        if (group.replicas_per_process() > 1) {
          place += " replica " + std::to_string(group.replica()) + "/" +
                   std::to_string(group.replicas_per_process()) + " on " + group.device().str();
        }
        const auto lines = ddp::all_gather_strings(group.cpu(), place);
        if (group.is_main()) {
          for (const auto& line : lines) std::cout << line << "\n";
        }
      }
      return train(group);
    }, group_options);
  });
  return aborted ? aborted : status;
}

namespace {

ddp::ImageDataset place(ddp::ProcessGroup& group, const ddp::ImageDataset& data,
                        const std::string& name) {
  const torch::Device device = group.device();
  const bool fits = ddp::fits_on(device, data.bytes(), group.rank());
  if (group.is_main()) {
    char size[32];
    std::snprintf(size, sizeof size, "%.1f MB", static_cast<double>(data.bytes()) / 1e6);
    std::cout << name << " set (" << size << ") ";
    if (!device.is_cuda()) {
      std::cout << "in host memory: training on " << device;
    } else if (fits) {
      std::cout << "on " << device << ": at most half of its free memory";
    } else {
      std::cout << "in host memory: more than half of " << device << "'s free memory; batches "
                << "are gathered into pinned memory and copied one step ahead";
    }
    std::cout << std::endl;
  }
  return fits ? data.to(device) : data;
}

}  // namespace

void place_data(ddp::ProcessGroup& group, ddp::ImageDataset& train, ddp::ImageDataset& test,
                const std::string& data_dir) {
  train = place(group, train, "Train");
  test = place(group, test, "Test");
  if (group.is_main()) {
    const ddp::Runtime& runtime = group.runtime();
    std::cout << "Train set size: " << train.size() << "\nTest set size: " << test.size()
              << "\nTraining on " << group.size()
              << (group.replicas_per_process() > 1 ? " replica(s)" : " rank(s)") << ", "
              << runtime.num_nodes() << " node(s), device " << group.device() << ", data "
              << data_dir << std::endl;
  }
}

std::unique_ptr<ddp::Timeline> make_timeline(ddp::ProcessGroup& group, const CommonFlags& flags) {
  if (flags.timeline.empty()) return nullptr;
  return std::make_unique<ddp::Timeline>(group.cpu());
}

std::unique_ptr<ddp::DistributedDataParallel> make_ddp(
    ddp::ProcessGroup& group, std::shared_ptr<torch::nn::Module> model, const CommonFlags& flags,
    Parallelism parallelism, ddp::Timeline* timeline) {
  if (parallelism != Parallelism::DataParallel) return nullptr;
  ddp::DDPOptions options;
  options.sync = ddp::parse_grad_sync(flags.grad_sync);
  options.compression = ddp::parse_compression(flags.compression);
  options.backend = ddp::parse_backend(flags.backend);
  options.bucket_cap_mb = flags.bucket_mb;
  options.first_bucket_mb = flags.first_bucket_mb;
  options.find_unused_parameters = flags.find_unused_parameters;
  options.broadcast_buffers = !flags.no_broadcast_buffers;
  options.timeline = timeline;
  return std::make_unique<ddp::DistributedDataParallel>(group, std::move(model), options);
}

ddp::TrainerOptions trainer_options(const CommonFlags& flags, ddp::Timeline* timeline) {
  // The Trainer checks its options too, but in its own terms: here the user hears of the flag.
  check_common_flags(flags);
  ddp::TrainerOptions options;
  options.batch_size = flags.batch_size;
  options.test_batch_size = flags.test_batch_size;
  options.log_interval = flags.log_interval;
  try {
    options.progress = ddp::parse_progress_mode(flags.progress);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--progress: ") + e.what());
  }
  options.limit_train_batches = flags.limit_train_batches;
  options.dry_run = flags.dry_run;
  options.seed = flags.seed;
  options.metrics_file = flags.metrics_file;
  options.timeline = timeline;
  options.check_sync_every = flags.check_sync_every;
  options.checkpoint.dir = flags.checkpoint_dir;
  options.checkpoint.keep = flags.keep_checkpoints;
  options.checkpoint.resume = flags.resume;
  options.checkpoint.fallback = flags.resume_fallback;
  options.checkpoint.every_steps = flags.checkpoint_every_steps;
  options.accumulate = flags.accumulate;
  options.clip_grad_norm = flags.clip_grad_norm;
  options.amp = ddp::parse_amp_mode(flags.amp);
  return options;
}

Schedules make_schedules(const CommonFlags& flags, torch::optim::Optimizer& optimizer,
                         int64_t train_size, int world_size, int64_t step_size, double gamma) {
  Schedules s;
  if (flags.scale_lr_with_batch > 0) {  // before the schedules, which take the rate as their base
    ddp::scale_lr_with_batch(optimizer, ddp::global_batch_size(flags.batch_size, world_size, flags.accumulate),
                             flags.scale_lr_with_batch);
  }
  if (flags.warmup_steps == 0) {
    if (flags.schedule == "cosine") {
      s.per_epoch = std::make_unique<ddp::CosineAnnealingLR>(optimizer, flags.epochs);
    } else {
      s.per_epoch = std::make_unique<ddp::StepLR>(optimizer, static_cast<unsigned>(step_size), gamma);
    }
    return s;
  }
  // The Trainer's count: the sampler's shard (padded), its batches, the limit, then groups.
  const int64_t shard = (train_size + world_size - 1) / world_size;
  int64_t batches = (shard + flags.batch_size - 1) / flags.batch_size;
  if (flags.limit_train_batches > 0) batches = std::min(batches, flags.limit_train_batches);
  if (flags.dry_run) batches = std::min<int64_t>(batches, 1);
  const int64_t steps_per_epoch = (batches + flags.accumulate - 1) / flags.accumulate;
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

int finish(ddp::ProcessGroup& group, const CommonFlags& flags, const ExampleDefaults& defaults,
           ddp::Timeline* timeline, const torch::nn::Module& model, const ddp::Trainer& trainer) {
  if (timeline) {
    timeline->write(flags.timeline);
    if (group.is_main()) std::cout << "Wrote the timeline to " << flags.timeline << std::endl;
  }
  if (trainer.stopped_by()) {
    if (group.is_main()) {
      std::cout << "Exit status " << ddp::kStoppedExitCode << ": stopped early by "
                << ddp::stop_signal_name(trainer.stopped_by());
      if (trainer.stop_snapshot().empty()) {
        std::cout << " with nothing saved (no --checkpoint-dir)";
      } else {
        std::cout << "; continue with the same command and --resume";
      }
      std::cout << std::endl;
    }
    return ddp::kStoppedExitCode;
  }
  if (flags.save_model && group.is_main()) {
    ddp::save_module(model, defaults.model_file);
    std::cout << "Saved " << defaults.model_file << std::endl;
  }
  return 0;
}

void check_batch_memory(ddp::ProcessGroup& group, const CommonFlags& flags, torch::nn::Module& model,
                        const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                        const std::vector<int64_t>& sample_shape, int64_t train_size,
                        int64_t test_size) {
  // Host memory only: on a GPU the batch lives in the device's memory (not estimated yet).
  if (group.device().is_cuda()) return;
  const ddp::HostMemory memory = ddp::host_memory_available();
  // A batch holds at most this replica's shard (the sampler pads shards to the same size).
  const int64_t ranks = group.size();
  // Every replica on the node holds its batch at once.
  const int local = group.runtime().local_size() * group.replicas_per_process();
  const int64_t train_batch = std::min(flags.batch_size, (train_size + ranks - 1) / ranks);
  const int64_t test_batch = std::min(flags.test_batch_size, (test_size + ranks - 1) / ranks);
  const uint64_t per_sample = ddp::training_bytes_per_sample(model, forward, sample_shape);
  ddp::require_batch_fits("--batch-size " + std::to_string(flags.batch_size) + " (" +
                              std::to_string(train_batch) + " samples per batch on each rank)",
                          train_batch, per_sample, local, memory);
  // Evaluation keeps no graph: the batch's pixels (uint8 and float32) are the lower bound.
  uint64_t pixels = 1;
  for (int64_t d : sample_shape) pixels *= static_cast<uint64_t>(d);
  ddp::require_batch_fits("--test-batch-size " + std::to_string(flags.test_batch_size) + " (" +
                              std::to_string(test_batch) + " samples per batch on each rank)",
                          test_batch, pixels * 5, local, memory);
}

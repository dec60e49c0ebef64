// A denoising autoencoder on Fashion-MNIST, trained data-parallel over MPI ranks:
//
//   mpirun -np 2 ddp_autoencoder --epochs 5 --metrics-file metrics.jsonl
//
// The input is an image plus Gaussian noise, the target the clean image, the loss their mean
// squared error. This file is written as a user of the installed library writes a program, in
// the shape of a PyTorch DDP script (docs/porting.md sets it beside seed 004's multigpu.py): its
// own torch::data dataset and DataLoader, its own loop through ddp::DistributedDataParallel, no
// Trainer, nothing from examples/. The training kit's parts give the loop what a cluster job
// needs: a stop signal (Slurm's SIGTERM, `scancel --signal=USR1`) on any rank stops every rank
// before the same step, a snapshot is written and the program exits 75 (requeue me); snapshots
// also at every epoch end (and every N steps); `--resume` continues from the newest; a progress
// bar or log lines, a metrics file, a summary. It builds on its own:
//
//   find_package(ddp REQUIRED)
//   add_executable(ddp_autoencoder ddp_autoencoder.cpp)
//   target_link_libraries(ddp_autoencoder PRIVATE ddp::train)
//
// Everything random is a function of --seed (weights), the epoch (shuffle) and the rank (noise),
// or kept in the snapshots (the noise generator inside an epoch), so `--resume` continues
// exactly where a stopped run was, even in the middle of an epoch: on the CPU, bit for bit.

#include <ddp/train/train.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// ---- Flags ------------------------------------------------------------------------------------

struct Flags {
  int64_t epochs = 5;
  int64_t batch_size = 64;           // per rank
  int64_t limit_train_batches = 0;   // 0: all
  int64_t accumulate = 1;            // micro-batches per optimizer step
  int64_t warmup_steps = 100;
  int64_t workers = 2;               // DataLoader worker threads
  int64_t seed = 1;
  int64_t log_interval = 10;         // batches between progress updates (0: none)
  int64_t checkpoint_every_steps = 0;
  int64_t stop_at_step = 0;          // 0: none
  double lr = 1e-3;
  double clip_grad_norm = 1.0;       // 0: off
  double noise = 0.3;                // standard deviation of the input noise
  std::string amp = "off";
  std::string data_dir = ddp::kDefaultMnistDir;
  std::string metrics_file;
  std::string checkpoint_dir;
  std::string sample_log;
  bool resume = false;
  bool no_cuda = false;
  bool help = false;
};

const char* const kUsage = R"(Usage: mpirun -np N ddp_autoencoder [options]
A denoising autoencoder on Fashion-MNIST (MSE between the clean image and the output for the
image plus Gaussian noise), trained data-parallel.

  --epochs N                epochs to train (5)
  --batch-size N            training batch per rank (64)
  --limit-train-batches N   at most N batches per epoch (0: all)
  --accumulate N            micro-batches per optimizer step, under no_sync (1)
  --lr X                    Adam's learning rate after warmup (0.001)
  --warmup-steps N          linear warmup over N optimizer steps, then cosine to 0 (100)
  --clip-grad-norm X        clip the gradients to this global 2-norm (1; 0: off)
  --amp M                   mixed precision of forward and loss: off or bf16 (off)
  --noise X                 standard deviation of the input noise (0.3)
  --workers N               DataLoader worker threads per rank (2)
  --seed N                  weights, data order and noise (1)
  --data-dir D              MNIST-format IDX files (/usr/share/datasets/fashion-mnist)
  --log-interval N          batches between progress updates, averaged over the ranks (10)
  --metrics-file F          rank 0 writes one JSON object per epoch to F
  --checkpoint-dir D        snapshots of the training state: at every epoch end (with the
                            weights, D/model_with_epoch<N>.pt) and on a stop signal
  --checkpoint-every-steps N  also a snapshot every N optimizer steps (0: none)
  --resume                  continue from the newest snapshot in D, if there is one
  --stop-at-step N          rehearse a preemption: rank 0 raises SIGTERM on itself after
                            optimizer step N, so every rank stops at the next step (0: never)
  --sample-log D            each rank appends "<epoch> <step> <index>" to D/rank<R>of<N>.txt
                            for every sample it trained (<step>: the step it went into)
  --no-cuda                 train on the CPU even when CUDA is available
  --help                    this text)";

// Parses "--name value" and "--name=value". Throws std::invalid_argument naming the flag.
Flags parse_flags(int argc, char** argv) {
  Flags f;
  std::set<std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i], value;
    const bool has_value = name.find('=') != std::string::npos;
    if (has_value) {
      value = name.substr(name.find('=') + 1);
      name = name.substr(0, name.find('='));
    }
    // Twice is refused, as ddp::cli refuses it: neither value is plainly the one meant.
    if (!given.insert(name).second) throw std::invalid_argument(name + " is given more than once");
    auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
      return argv[++i];
    };
    auto integer = [&](int64_t least) {
      const std::string text = next();
      std::size_t used = 0;
      int64_t v = 0;
      try {
        v = std::stoll(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != text.size()) {
        throw std::invalid_argument(name + " must be an integer (got '" + text + "')");
      }
      if (v < least) {
        throw std::invalid_argument(name + " must be >= " + std::to_string(least) + " (got " +
                                    text + ")");
      }
      return v;
    };
    auto number = [&](double least, bool least_allowed) {
      const std::string text = next();
      std::size_t used = 0;
      double v = NAN;
      try {
        v = std::stod(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      // Written so that NaN fails: every comparison with NaN is false.
      if (used == 0 || used != text.size() || !std::isfinite(v) ||
          !(v > least || (least_allowed && v == least))) {
        throw std::invalid_argument(name + " must be a finite number " +
                                    (least_allowed ? ">= " : "> ") + std::to_string(least) +
                                    " (got '" + text + "')");
      }
      return v;
    };
    auto flag = [&]() {
      if (has_value) throw std::invalid_argument(name + " takes no value");
      return true;
    };
    if (name == "--epochs") f.epochs = integer(1);
    else if (name == "--batch-size") f.batch_size = integer(1);
    else if (name == "--limit-train-batches") f.limit_train_batches = integer(0);
    else if (name == "--accumulate") f.accumulate = integer(1);
    else if (name == "--warmup-steps") f.warmup_steps = integer(0);
    else if (name == "--workers") f.workers = integer(0);
    else if (name == "--seed") f.seed = integer(0);
    else if (name == "--log-interval") f.log_interval = integer(0);
    else if (name == "--checkpoint-every-steps") f.checkpoint_every_steps = integer(0);
    else if (name == "--stop-at-step") f.stop_at_step = integer(0);
    else if (name == "--lr") f.lr = number(0, false);
    else if (name == "--clip-grad-norm") f.clip_grad_norm = number(0, true);
    else if (name == "--noise") f.noise = number(0, true);
    else if (name == "--amp") f.amp = next();
    else if (name == "--data-dir") f.data_dir = next();
    else if (name == "--metrics-file") f.metrics_file = next();
    else if (name == "--checkpoint-dir") f.checkpoint_dir = next();
    else if (name == "--sample-log") f.sample_log = next();
    else if (name == "--resume") f.resume = flag();
    else if (name == "--no-cuda") f.no_cuda = flag();
    else if (name == "--help" || name == "-h") f.help = flag();
    else throw std::invalid_argument("unknown flag " + name);
  }
  ddp::check_loader_workers("--workers", f.workers);  // threads: a huge count fails late, unnamed
  if (f.amp != "off" && f.amp != "bf16") {
    throw std::invalid_argument("--amp must be off or bf16 (got '" + f.amp + "')");
  }
  if ((f.resume || f.checkpoint_every_steps > 0) && f.checkpoint_dir.empty()) {
    throw std::invalid_argument(std::string(f.resume ? "--resume" : "--checkpoint-every-steps") +
                                " needs --checkpoint-dir");
  }
  return f;
}

// ---- Data -------------------------------------------------------------------------------------

// Fashion-MNIST's images as float32 [1, 28, 28] in 0..1 (the labels are not needed), read
// from the IDX files with the library's reader (ddp::read_idx, .gz or raw).
class FashionMnist : public torch::data::datasets::Dataset<FashionMnist> {
 public:
  FashionMnist(const std::string& dir, bool train)
      : images_(ddp::read_idx(dir + (train ? "/train-images-idx3-ubyte" : "/t10k-images-idx3-ubyte"))
                    .unsqueeze(1).to(torch::kFloat32).div_(255)) {}

  torch::data::Example<> get(size_t index) override {
    return {images_[static_cast<int64_t>(index)], torch::Tensor()};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(images_.size(0)); }
  const torch::Tensor& images() const { return images_; }

 private:
  torch::Tensor images_;
};

// The images only: a batch is the stacked [B, 1, 28, 28] tensor.
struct StackImages : torch::data::transforms::Collation<torch::Tensor, std::vector<torch::data::Example<>>> {
  torch::Tensor apply_batch(std::vector<torch::data::Example<>> examples) override {
    std::vector<torch::Tensor> images;
    images.reserve(examples.size());
    for (auto& example : examples) images.push_back(std::move(example.data));
    return torch::stack(images);
  }
};

// ---- Model ------------------------------------------------------------------------------------

// 28x28 -> 16x14x14 -> 32x7x7 -> 16x14x14 -> 28x28, with a BatchNorm whose running statistics
// the wrapper broadcasts from rank 0 before every training forward.
struct AutoencoderImpl : torch::nn::Module {
  AutoencoderImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).stride(2).padding(1)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(16))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)))),
        deconv1(register_module("deconv1", torch::nn::ConvTranspose2d(
            torch::nn::ConvTranspose2dOptions(32, 16, 3).stride(2).padding(1).output_padding(1)))),
        deconv2(register_module("deconv2", torch::nn::ConvTranspose2d(
            torch::nn::ConvTranspose2dOptions(16, 1, 3).stride(2).padding(1).output_padding(1)))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    x = torch::relu(conv2(x));
    x = torch::relu(deconv1(x));
    return torch::sigmoid(deconv2(x));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::ConvTranspose2d deconv1, deconv2;
};
TORCH_MODULE(Autoencoder);

// ---- Evaluation -------------------------------------------------------------------------------

// The mean squared error over the whole test set: each rank takes its evaluation shard (every
// image exactly once over the ranks, no padding), and the sums are added over the ranks. Every
// rank evaluates with rank 0's BatchNorm statistics (prepare_forward), the model rank 0 saves.
double test_loss(ddp::DistributedDataParallel& model, const FashionMnist& test, double noise,
                 int64_t seed, ddp::ProcessGroup& group, torch::Device device) {
  model.prepare_forward();
  model.module().eval();
  torch::NoGradGuard no_grad;
  const auto shard = ddp::evaluation_shard(test.images().size(0), group.size(), group.rank());
  // The same noisy test set in every epoch, whatever the number of ranks: noise per image index.
  torch::Tensor sums = torch::zeros({2}, torch::kFloat64);  // squared error, elements
  const int64_t batch = 1000;
  for (size_t begin = 0; begin < shard.size(); begin += batch) {
    const size_t end = std::min(shard.size(), begin + batch);
    const torch::Tensor index = torch::tensor(std::vector<int64_t>(shard.begin() + begin, shard.begin() + end));
    const torch::Tensor clean = test.images().index_select(0, index);
    torch::Tensor noisy = clean.clone();
    for (int64_t i = 0; i < clean.size(0); ++i) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + shard[begin + i]);
      noisy[i] += noise * torch::randn(clean[i].sizes(), generator);
    }
    const torch::Tensor output = model(noisy.to(device));
    sums[0] += torch::mse_loss(output.to(torch::kFloat32), clean.to(device), torch::Reduction::Sum)
                   .item<double>();
    sums[1] += static_cast<double>(clean.numel());
  }
  group.cpu().all_reduce(sums);
  model.module().train();
  return sums[0].item<double>() / sums[1].item<double>();
}

// --sample-log: appends `lines` to D/rank<R>of<N>.txt (and empties them), opened for each step so
// that what a stopped run trained is on disk.
void append(const std::string& dir, int rank, int ranks, std::string& lines) {
  const std::string path = dir + "/rank" + std::to_string(rank) + "of" + std::to_string(ranks) + ".txt";
  std::ofstream out(path, std::ios::app);
  out << lines;
  if (!out.flush()) throw std::runtime_error("--sample-log: cannot append to " + path);
  lines.clear();
}

int train(const Flags& flags, ddp::Runtime& runtime) {
  ddp::ProcessGroup group(runtime);
  const torch::Device device = runtime.device();
  const int rank = runtime.rank(), world_size = runtime.world_size();

  // Data: a torch::data dataset and the library's DistributedSampler (the DataLoader: below).
  FashionMnist train_set(flags.data_dir, /*train=*/true), test_set(flags.data_dir, /*train=*/false);
  ddp::DistributedSampler sampler(train_set.size().value(), world_size, rank, /*shuffle=*/true,
                                  flags.seed);
  // Batches per rank and epoch (of its shard, at most --limit-train-batches), and the steps they make.
  const ddp::EpochLength length =
      ddp::epoch_length(sampler.num_batches(flags.batch_size), flags.limit_train_batches, flags.accumulate);

  // Model, wrapper, optimizer, schedule.
  torch::manual_seed(static_cast<uint64_t>(flags.seed));
  Autoencoder net;
  net->to(device);
  ddp::DistributedDataParallel model(group, net.ptr());  // rank 0's weights everywhere
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(flags.lr));
  ddp::LRScheduleOptions schedule_options;
  schedule_options.warmup_steps = flags.warmup_steps;
  schedule_options.decay = ddp::LRDecay::Cosine;
  schedule_options.decay_steps = std::max<int64_t>(1, flags.epochs * length.steps - flags.warmup_steps);
  ddp::LRSchedule schedule(optimizer, schedule_options);
  const bool bf16 = flags.amp == "bf16";

  // The kit's parts: the step boundary (a stop signal on any rank stops every rank before the
  // same step; snapshots, and where to continue after --resume; the directory is checked now,
  // not after an epoch), and the progress, the metrics file and the summary.
  ddp::CheckpointerOptions checkpoints;
  checkpoints.dir = flags.checkpoint_dir;
  checkpoints.resume = flags.resume ? "latest" : "";
  checkpoints.every_steps = flags.checkpoint_every_steps;
  checkpoints.seed = flags.seed;
  checkpoints.batch_size = flags.batch_size;
  ddp::StepBoundary boundary(group, ddp::Checkpointer(group, model, optimizer, checkpoints, {&schedule}));
  ddp::ReporterOptions report;
  report.log_interval = flags.log_interval;
  report.metrics_file = flags.metrics_file;
  ddp::Reporter reporter(group, report);
  const ddp::ResumePoint& resumed = boundary.resume();  // where to continue: epoch, batch, step
  reporter.start_run(resumed);
  if (rank == 0) {
    std::cout << "Training a denoising autoencoder on " << world_size << " rank(s), device "
              << device << ", " << length.batches << " batches of " << flags.batch_size
              << " per rank and epoch" << std::endl;
  }

  int64_t step = resumed.position.step;
  std::vector<ddp::EpochResult> results;
  for (int64_t epoch = resumed.position.epoch; epoch <= flags.epochs; ++epoch) {
    // A new shuffle every epoch, the same on every rank; a resumed epoch continues where the
    // snapshot was (its rest re-sharded when the world size changed).
    const ddp::EpochStart start = boundary.start_epoch(epoch, sampler, flags.batch_size);
    // The noise of this rank in this epoch: different on every rank, kept in step snapshots.
    at::Generator noise = ddp::augmentation_generator(flags.seed, rank, epoch);
    ddp::EpochMeter meter({}, device);  // the epoch's loss and samples, over the ranks at its end
    if (start.rank_state.generator.defined()) {  // resumed inside this epoch on as many ranks
      noise.set_state(start.rank_state.generator);
      meter.restore(start.rank_state.values);
    }
    const int64_t batches_per_epoch = start.batches(sampler, flags.batch_size);
    const int64_t last = ddp::epoch_length(batches_per_epoch, flags.limit_train_batches).batches;
    const int64_t first = start.first_batch;
    // A loader per epoch, over the batches of it still to train (counted in the sampler's).
    auto loader = torch::data::make_data_loader(
        train_set.map(StackImages()),
        ddp::BatchRangeSampler(sampler, flags.batch_size, start.sampler_batch(first), start.sampler_batch(last)),
        torch::data::DataLoaderOptions().batch_size(flags.batch_size).workers(flags.workers));
    reporter.start_epoch({epoch, first, last, batches_per_epoch, flags.batch_size,
                          static_cast<int64_t>(train_set.size().value()), start.sampler_offset,
                          start.sampler_start});
    const std::vector<int64_t> order = flags.sample_log.empty() ? std::vector<int64_t>() : sampler.indices();
    std::string trained;  // --sample-log: the lines of the step in progress
    int64_t batch = first;
    for (torch::Tensor clean : *loader) {
      // `--accumulate N`: N micro-batches per step; the gradients are averaged over the ranks
      // only in the last backward, the others accumulate locally under no_sync().
      const int64_t first_of_step = batch - batch % flags.accumulate;
      const int64_t group_size = std::min(flags.accumulate, last - first_of_step);
      const bool step_now = batch + 1 == first_of_step + group_size;
      if (batch == first_of_step) {  // a step boundary: the ranks agree whether to stop
        const bool stopping = boundary.at_step(batch, step, [&] {
          return ddp::RankState{noise.get_state(), meter.state()};
        });
        if (stopping) {
          reporter.stopped(boundary.stop(), boundary.position(), boundary.snapshot());
          return ddp::kStoppedExitCode;  // 75: saved; run the same command with --resume
        }
      }
      const torch::Tensor noisy = clean + flags.noise * torch::randn(clean.sizes(), noise);
      clean = clean.to(device);
      if (batch == first_of_step) optimizer.zero_grad();
      torch::Tensor loss;
      {
        ddp::Autocast autocast(device.type(), torch::kBFloat16, /*enabled=*/bf16);
        loss = torch::mse_loss(model(noisy.to(device)).to(torch::kFloat32), clean);
      }
      if (step_now) {
        (loss / static_cast<double>(group_size)).backward();  // gradients averaged over ranks
      } else {
        auto no_sync = model.no_sync();
        (loss / static_cast<double>(group_size)).backward();  // local accumulation only
      }
      for (int64_t i = 0; !order.empty() && i < clean.size(0); ++i) {
        const size_t at = static_cast<size_t>(start.sampler_batch(batch) * flags.batch_size + i);
        trained += std::to_string(epoch) + " " + std::to_string(step + 1) + " " +
                   std::to_string(order[at]) + "\n";
      }
      ddp::StepScalars record;  // what a step record shows besides the loss (--metrics-file)
      record.lr = optimizer.param_groups().front().options().get_lr();
      if (step_now) {
        if (flags.clip_grad_norm > 0) record.grad_norm = ddp::clip_grad_norm(net->parameters(), flags.clip_grad_norm);
        optimizer.step();
        schedule.step();  // warmup, then cosine, per optimizer step
        ++step;
        if (!flags.sample_log.empty()) append(flags.sample_log, rank, world_size, trained);
        if (step == flags.stop_at_step && rank == 0) std::raise(SIGTERM);
      }
      record.step = step;
      meter.add(loss, clean.size(0));
      reporter.batch_done(batch, loss, clean.size(0), record);  // the bar or a log line; a step record
      ++batch;
    }
    boundary.end_epoch();  // collective: a stop or a non-finite loss agreed before the snapshot
    reporter.end_epoch();
    // The epoch over all ranks, the test loss over the whole test set, then the snapshot.
    ddp::EpochResult result = meter.reduce(group.cpu(), epoch);
    result.test_loss = test_loss(model, test_set, flags.noise, flags.seed, group, device);
    reporter.print_epoch(result);  // its lines (rank 0)
    results.push_back(result);
    boundary.checkpointer().save_epoch(epoch, step);
    reporter.write_metrics(result);  // after the save: a failed write does not cost the epoch
  }
  reporter.end_run(results);
  boundary.end_run(flags.epochs);  // rank 0 says if nothing was left, or a signal came too late
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Flags first: --no-cuda decides the device the Runtime picks. Every rank parses the same
  // flags, so a bad one stops every rank; rank 0 says why.
  Flags flags;
  std::string flag_error;
  try {
    flags = parse_flags(argc, argv);
  } catch (const std::invalid_argument& e) {
    flag_error = e.what();
  }
  ddp::RuntimeOptions options;
  options.use_cuda = !flags.no_cuda;
  options.print_banner = flag_error.empty() && !flags.help;
  ddp::Runtime runtime(argc, argv, options);             // MPI up; rank, node, device
  if (!flag_error.empty() || flags.help) {
    if (runtime.is_main()) {
      if (flags.help) std::cout << kUsage << std::endl;
      else std::cerr << "ddp_autoencoder: " << flag_error << " (see --help)" << std::endl;
    }
    return flags.help ? 0 : 2;
  }
  // an error on any rank ends the job, naming the rank
  int status = 0;
  const int aborted = ddp::run_or_abort(runtime, [&] { status = train(flags, runtime); });
  return aborted ? aborted : status;
}

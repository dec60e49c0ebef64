// A DCGAN on MNIST-format images, trained data-parallel over MPI ranks: PyTorch's C++ DCGAN
// example (pytorch/examples, cpp/dcgan/dcgan.cpp) ported to ddp.
//
//   mpirun -np 2 ddp_dcgan --epochs 30 --checkpoint-dir ckpt --sample-dir samples
//
// The same models, optimizers and step as the original: a generator (transposed convolutions,
// noise [B, 100, 1, 1] -> image [B, 1, 28, 28] in [-1, 1]), a discriminator that is a
// torch::nn::Sequential, Adam for each; per step the discriminator on real images (labels drawn
// from [0.8, 1), label smoothing) and on the generator's images, detached (labels 0), its step;
// then the generator's loss through the discriminator (labels 1), its step. What the port adds,
// each marked "ddp:" where it is:
//  - a wrapper per model, so each backward averages that model's gradients over the ranks;
//  - no_sync() on the discriminator in the generator's backward: those gradients are zeroed
//    before the discriminator's next step, so averaging them would be wasted communication;
//  - a DistributedSampler (each rank its shard of the images), and noise drawn per rank;
//  - one snapshot of both models and both optimizers (SnapshotParts), a stop signal on any rank
//    stops every rank before the same step (exit 75) and --resume continues bit for bit;
//  - the sample images drawn on rank 0 alone, through the module, not through the wrapper.
// It builds against the installed package alone, as examples/ddp_autoencoder.cpp does. Beyond
// the port: Adam's betas are the DCGAN paper's (0.5, 0.999) (dcgan.cpp has (0.5, 0.5)), the
// samples come from a fixed noise in eval(), and flags for the tests (docs/porting.md).
//
// Everything random is a function of --seed (the weights, the data order, the sample noise),
// the epoch and the rank (the training noise and the real labels), or kept in the snapshots (that
// noise generator inside an epoch): on the CPU a run is the same bit for bit on every repeat at
// the same world size, and a --resume continues it exactly.

#include <ddp/train/train.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// The size of the noise vector fed to the generator, and the images drawn per sample.
constexpr int64_t kNoiseSize = 100;
constexpr int64_t kSamples = 10;

// ---- Flags ------------------------------------------------------------------------------------

struct Flags {
  int64_t epochs = 30;
  int64_t batch_size = 64;           // per rank
  int64_t limit_train_batches = 0;   // 0: all
  int64_t workers = 2;               // DataLoader worker threads
  int64_t seed = 1;
  int64_t log_interval = 10;         // 0: no loss lines
  int64_t checkpoint_every_steps = 0;
  int64_t sample_every = 200;
  int64_t stop_at_step = 0;          // 0: none
  int64_t stop_rank = 0;
  std::string data_dir = ddp::kDefaultMnistDir;
  std::string checkpoint_dir;
  std::string sample_dir;
  std::string params_dir;
  bool same_data = false;
  bool resume = false;
  bool no_cuda = false;
  bool help = false;
};

const char* const kUsage = R"(Usage: mpirun -np N ddp_dcgan [options]
A DCGAN (PyTorch's C++ example) on MNIST-format images, both models trained data-parallel.

  --epochs N                epochs to train (30)
  --batch-size N            training batch per rank (64)
  --limit-train-batches N   at most N batches (steps) per epoch (0: all)
  --workers N               DataLoader worker threads per rank (2)
  --seed N                  weights, data order and noise (1)
  --data-dir D              MNIST-format IDX files, plain or .gz (/usr/share/datasets/fashion-mnist)
  --log-interval N          steps between loss lines, averaged over the ranks (10; 0: none)
  --checkpoint-dir D        snapshots of both models and optimizers: at every epoch end (with
                            the weights, D/generator_with_epoch<N>.pt and discriminator_...)
                            and on a stop signal (SIGTERM, SIGUSR1, SIGUSR2: exit status 75)
  --checkpoint-every-steps N  also a snapshot every N steps (0: none)
  --resume                  continue from the newest snapshot in D, if there is one
  --sample-every N          rank 0 draws 10 images every N steps (200)
  --sample-dir D            ... and writes them to D/dcgan-sample-<step>.pgm (none: not drawn)
  --same-data               every rank trains rank 0's batches with rank 0's noise: the ranks are
                            identical replicas of the 1-rank run, whose result they reproduce bit
                            for bit (a test of the averaging, not a way to train; resume it on
                            as many ranks)
  --params-dir D            at the end each rank writes its parameters and buffers (after a
                            buffer broadcast) to D/rank<R>.bin, raw bytes, for `cmp`
  --stop-at-step N          rehearse a preemption: rank --stop-rank raises SIGTERM on itself
                            after step N, so every rank stops at the next step (0: never)
  --stop-rank R             the rank that raises it (0)
  --no-cuda                 train on the CPU even when CUDA is available
  --help                    this text)";

// Parses "--name value" and "--name=value" (ddp_autoencoder's parser). Throws
// std::invalid_argument naming the flag.
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
    auto flag = [&]() {
      if (has_value) throw std::invalid_argument(name + " takes no value");
      return true;
    };
    if (name == "--epochs") f.epochs = integer(1);
    else if (name == "--batch-size") f.batch_size = integer(1);
    else if (name == "--limit-train-batches") f.limit_train_batches = integer(0);
    else if (name == "--workers") f.workers = integer(0);
    else if (name == "--seed") f.seed = integer(0);
    else if (name == "--log-interval") f.log_interval = integer(0);
    else if (name == "--checkpoint-every-steps") f.checkpoint_every_steps = integer(0);
    else if (name == "--sample-every") f.sample_every = integer(1);
    else if (name == "--stop-at-step") f.stop_at_step = integer(0);
    else if (name == "--stop-rank") f.stop_rank = integer(0);
    else if (name == "--data-dir") f.data_dir = next();
    else if (name == "--checkpoint-dir") f.checkpoint_dir = next();
    else if (name == "--sample-dir") f.sample_dir = next();
    else if (name == "--params-dir") f.params_dir = next();
    else if (name == "--same-data") f.same_data = flag();
    else if (name == "--resume") f.resume = flag();
    else if (name == "--no-cuda") f.no_cuda = flag();
    else if (name == "--help" || name == "-h") f.help = flag();
    else throw std::invalid_argument("unknown flag " + name);
  }
  ddp::check_loader_workers("--workers", f.workers);  // threads: a huge count fails late, unnamed
  if ((f.resume || f.checkpoint_every_steps > 0) && f.checkpoint_dir.empty()) {
    throw std::invalid_argument(std::string(f.resume ? "--resume" : "--checkpoint-every-steps") +
                                " needs --checkpoint-dir");
  }
  return f;
}

// ---- Data -------------------------------------------------------------------------------------

// The training images as float32 [1, 28, 28] in 0..1 with their labels, read with the library's
// IDX reader (plain or .gz, any number of images): torch::data::datasets::MNIST's place, which
// reads only the uncompressed files of all 60000.
class Mnist : public torch::data::datasets::Dataset<Mnist> {
 public:
  explicit Mnist(const std::string& dir)
      : images_(ddp::read_idx(dir + "/train-images-idx3-ubyte").unsqueeze(1).to(torch::kFloat32).div_(255)),
        labels_(ddp::read_idx(dir + "/train-labels-idx1-ubyte").to(torch::kInt64)) {}

  torch::data::Example<> get(size_t index) override {
    return {images_[static_cast<int64_t>(index)], labels_[static_cast<int64_t>(index)]};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(images_.size(0)); }

 private:
  torch::Tensor images_, labels_;
};

// ---- Models -----------------------------------------------------------------------------------

// Noise [B, 100, 1, 1] -> [B, 256, 4, 4] -> [B, 128, 7, 7] -> [B, 64, 14, 14] -> [B, 1, 28, 28].
struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl()
      : up1(register_module("up1", torch::nn::ConvTranspose2d(
            torch::nn::ConvTranspose2dOptions(kNoiseSize, 256, 4).bias(false)))),
        norm1(register_module("norm1", torch::nn::BatchNorm2d(256))),
        up2(register_module("up2", torch::nn::ConvTranspose2d(
            torch::nn::ConvTranspose2dOptions(256, 128, 3).stride(2).padding(1).bias(false)))),
        norm2(register_module("norm2", torch::nn::BatchNorm2d(128))),
        up3(register_module("up3", torch::nn::ConvTranspose2d(
            torch::nn::ConvTranspose2dOptions(128, 64, 4).stride(2).padding(1).bias(false)))),
        norm3(register_module("norm3", torch::nn::BatchNorm2d(64))),
        up4(register_module("up4", torch::nn::ConvTranspose2d(
            torch::nn::ConvTranspose2dOptions(64, 1, 4).stride(2).padding(1).bias(false)))) {}

  torch::Tensor forward(torch::Tensor z) {
    torch::Tensor x = torch::relu(norm1(up1(z)));
    x = torch::relu(norm2(up2(x)));
    x = torch::relu(norm3(up3(x)));
    return torch::tanh(up4(x));
  }

  torch::nn::ConvTranspose2d up1;
  torch::nn::BatchNorm2d norm1;
  torch::nn::ConvTranspose2d up2;
  torch::nn::BatchNorm2d norm2;
  torch::nn::ConvTranspose2d up3;
  torch::nn::BatchNorm2d norm3;
  torch::nn::ConvTranspose2d up4;
};
TORCH_MODULE(Generator);

// Image [B, 1, 28, 28] -> [B, 64, 14, 14] -> [B, 128, 7, 7] -> [B, 256, 3, 3] -> [B, 1, 1, 1],
// the probability that the image is real.
torch::nn::Sequential make_discriminator() {
  auto leaky = [] { return torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2)); };
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 64, 4).stride(2).padding(1).bias(false)), leaky(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 4).stride(2).padding(1).bias(false)),
      torch::nn::BatchNorm2d(128), leaky(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 256, 4).stride(2).padding(1).bias(false)),
      torch::nn::BatchNorm2d(256), leaky(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(256, 1, 3).stride(1).padding(0).bias(false)),
      torch::nn::Sigmoid());
}

// ---- Output -----------------------------------------------------------------------------------

// Writes images [N, 1, 28, 28] in [-1, 1] side by side as a binary PGM (any image viewer).
void write_pgm(const std::string& path, const torch::Tensor& images) {
  const torch::Tensor row = ((images.to(torch::kCPU).squeeze(1) + 1) * 127.5).round().clamp(0, 255)
                                .to(torch::kUInt8).permute({1, 0, 2}).reshape({28, -1}).contiguous();
  std::ofstream out(path, std::ios::binary);
  out << "P5\n" << row.size(1) << " " << row.size(0) << "\n255\n";
  out.write(reinterpret_cast<const char*>(row.data_ptr<uint8_t>()), row.numel());
  if (!out.flush()) throw std::runtime_error("--sample-dir: cannot write " + path);
}

// FNV-1a over the bytes of every parameter and buffer of `module` (names included), appended to
// `bytes`: a file two runs compare with cmp, a hash they print.
uint64_t append_state(const torch::nn::Module& module, std::string& bytes) {
  const size_t from = bytes.size();
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    const torch::Tensor cpu = t.detach().to(torch::kCPU).contiguous();
    bytes += name + '\n';
    bytes.append(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
  };
  for (const auto& p : module.named_parameters()) add(p.key(), p.value());
  for (const auto& b : module.named_buffers()) add(b.key(), b.value());
  uint64_t hash = 1469598103934665603ULL;
  for (size_t i = from; i < bytes.size(); ++i) hash = (hash ^ static_cast<uint8_t>(bytes[i])) * 1099511628211ULL;
  return hash;
}

int train(const Flags& flags, ddp::Runtime& runtime) {
  ddp::ProcessGroup group(runtime);
  const torch::Device device = runtime.device();
  const int rank = runtime.rank(), world_size = runtime.world_size();
  if (flags.stop_rank >= world_size) {
    throw std::invalid_argument("--stop-rank " + std::to_string(flags.stop_rank) + " is not a rank of " +
                                std::to_string(world_size));
  }
  if (!flags.params_dir.empty()) std::filesystem::create_directories(flags.params_dir);
  if (!flags.sample_dir.empty() && rank == 0) std::filesystem::create_directories(flags.sample_dir);
  // ddp: --same-data makes every rank rank 0 of a 1-rank run: its shard (all of it) and its noise.
  const int data_rank = flags.same_data ? 0 : rank, data_ranks = flags.same_data ? 1 : world_size;

  // The models: the same initial weights on every rank (the wrappers broadcast rank 0's anyway).
  torch::manual_seed(static_cast<uint64_t>(flags.seed));
  Generator generator;
  generator->to(device);
  torch::nn::Sequential discriminator = make_discriminator();
  discriminator->to(device);
  // ddp: a wrapper per model. Each forward through a wrapper in training (grad mode on) is
  // collective (it broadcasts rank 0's BatchNorm statistics): every rank makes the same ones.
  ddp::DistributedDataParallel g_model(group, generator);
  ddp::DistributedDataParallel d_model(group, discriminator);  // a Sequential: d_model.forward(x)

  // MNIST in [-1, 1], a shard per rank.
  auto dataset = Mnist(flags.data_dir)
                     .map(torch::data::transforms::Normalize<>(0.5, 0.5))
                     .map(torch::data::transforms::Stack<>());
  ddp::DistributedSampler sampler(dataset.size().value(), data_ranks, data_rank, /*shuffle=*/true, flags.seed);
  auto limited = [&](int64_t batches) {
    return flags.limit_train_batches > 0 ? std::min(batches, flags.limit_train_batches) : batches;
  };

  torch::optim::Adam g_optimizer(generator->parameters(),
                                 torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.999)));
  torch::optim::Adam d_optimizer(discriminator->parameters(),
                                 torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.999)));

  // ddp: both models and both optimizers in one snapshot, each under its name; the step boundary
  // agrees on a stop signal and writes the snapshots. The optimizers' types and options are
  // recorded and compared on --resume; so is --same-data (the caller's setting).
  ddp::CheckpointerOptions checkpoints;
  checkpoints.dir = flags.checkpoint_dir;
  checkpoints.resume = flags.resume ? "latest" : "";
  checkpoints.every_steps = flags.checkpoint_every_steps;
  checkpoints.seed = flags.seed;
  checkpoints.batch_size = flags.batch_size;
  checkpoints.settings = {{"same_data", flags.same_data ? "true" : "false"}};
  const ddp::SnapshotParts parts{{{"generator", generator.ptr().get()}, {"discriminator", discriminator.ptr().get()}},
                                 {{"generator", &g_optimizer}, {"discriminator", &d_optimizer}}};
  ddp::StepBoundary boundary(group, ddp::Checkpointer(group, parts, checkpoints));
  ddp::ReporterOptions report;
  report.progress = ddp::ProgressMode::None;  // the loss lines are the original's, below
  ddp::Reporter reporter(group, report);      // for the line that says where the ranks stopped
  const ddp::ResumePoint& resumed = boundary.resume();  // collective: where to continue
  if (rank == 0) {
    std::cout << "Training a DCGAN on " << world_size << " rank(s)" << (flags.same_data ? " (the same data on each)" : "")
              << ", device " << device << ", " << flags.epochs << " epoch(s)" << std::endl;
  }

  int64_t step = resumed.position.step;
  for (int64_t epoch = resumed.position.epoch; epoch <= flags.epochs; ++epoch) {
    const ddp::EpochStart start = boundary.start_epoch(epoch, sampler, flags.batch_size);
    // ddp: this rank's noise and real labels, a generator of (seed, rank, epoch): torch::randn
    // without one would draw the same noise on every rank. Kept in step snapshots.
    at::Generator noise = ddp::augmentation_generator(flags.seed, data_rank, epoch);
    if (start.rank_state.generator.defined()) noise.set_state(start.rank_state.generator);
    const int64_t batches = limited(start.batches(sampler, flags.batch_size));
    auto data_loader = torch::data::make_data_loader(
        dataset, ddp::BatchRangeSampler(sampler, flags.batch_size, start.sampler_batch(start.first_batch),
                                        start.sampler_batch(batches)),
        torch::data::DataLoaderOptions().batch_size(flags.batch_size).workers(flags.workers));
    int64_t batch_index = start.first_batch;
    for (const torch::data::Example<>& batch : *data_loader) {
      // ddp: the step boundary: every rank agrees whether to stop (a signal on any of them).
      if (boundary.at_step(batch_index, step, [&] { return ddp::RankState{noise.get_state(), {}}; })) {
        reporter.stopped(boundary.stop(), boundary.position(), boundary.snapshot());
        return ddp::kStoppedExitCode;  // 75: saved; run the same command with --resume
      }
      const int64_t n = batch.data.size(0);
      // Train the discriminator with real images.
      discriminator->zero_grad();
      torch::Tensor real_images = batch.data.to(device);
      torch::Tensor real_labels = torch::empty({n}).uniform_(0.8, 1.0, noise).to(device);
      torch::Tensor real_output = d_model.forward(real_images).reshape(real_labels.sizes());
      torch::Tensor d_loss_real = torch::binary_cross_entropy(real_output, real_labels);
      d_loss_real.backward();  // the discriminator's gradients, averaged over the ranks

      // Train the discriminator with fake images.
      torch::Tensor z = torch::randn({n, kNoiseSize, 1, 1}, noise).to(device);
      torch::Tensor fake_images = g_model.forward(z);
      torch::Tensor fake_labels = torch::zeros({n}, device);
      torch::Tensor fake_output = d_model.forward(fake_images.detach()).reshape(fake_labels.sizes());
      torch::Tensor d_loss_fake = torch::binary_cross_entropy(fake_output, fake_labels);
      d_loss_fake.backward();  // averaged again, added to the real images' average
      torch::Tensor d_loss = d_loss_real + d_loss_fake;
      d_optimizer.step();

      // Train the generator.
      generator->zero_grad();
      fake_labels.fill_(1);
      fake_output = d_model.forward(fake_images).reshape(fake_labels.sizes());
      torch::Tensor g_loss = torch::binary_cross_entropy(fake_output, fake_labels);
      {
        // ddp: this backward also gives the discriminator gradients, which its zero_grad() drops
        // before they are used: no_sync() spares their all-reduce. The generator's are averaged.
        // no_sync() must be the same on every rank (the wrapper's contract): here every rank
        // runs this block at every step.
        auto no_sync = d_model.no_sync();
        g_loss.backward();
      }
      g_optimizer.step();
      ++step;
      ++batch_index;
      if (flags.stop_at_step == step && flags.stop_rank == rank) std::raise(SIGTERM);

      if (flags.log_interval > 0 && batch_index % flags.log_interval == 0) {
        // ddp: the losses averaged over the ranks (collective: every rank, the same batches).
        torch::Tensor losses = torch::stack({d_loss.detach(), g_loss.detach()}).to(torch::kCPU, torch::kFloat64);
        group.cpu().all_reduce(losses);
        losses /= world_size;
        if (rank == 0) {
          std::printf("[%2ld/%2ld][%3ld/%3ld] D_loss: %.4f | G_loss: %.4f\n", static_cast<long>(epoch),
                      static_cast<long>(flags.epochs), static_cast<long>(batch_index), static_cast<long>(batches),
                      losses[0].item<double>(), losses[1].item<double>());
          std::fflush(stdout);
        }
      }
      if (!flags.sample_dir.empty() && step % flags.sample_every == 0 && rank == 0) {
        // ddp: one rank only, so through the module: a training forward through g_model would
        // be a collective that the other ranks never join. In eval() BatchNorm uses the running
        // statistics and leaves them as they are; the noise is its own generator's, the same at
        // every sample (the images show the training's progress), so training draws as without.
        torch::NoGradGuard no_grad;
        generator->eval();
        const torch::Tensor fixed = torch::randn({kSamples, kNoiseSize, 1, 1},
                                                 at::make_generator<at::CPUGeneratorImpl>(flags.seed));
        write_pgm(flags.sample_dir + "/dcgan-sample-" + std::to_string(step) + ".pgm",
                  generator->forward(fixed.to(device)));
        generator->train();
      }
    }
    boundary.end_epoch();  // ddp: a stop signal in the epoch's last step stops before the next
    boundary.checkpointer().save_epoch(epoch, step);  // ddp: the epoch-end snapshot, collective
  }
  boundary.end_run(flags.epochs);  // ddp: rank 0 says if nothing was left, or a signal came too late

  // Rank 0's BatchNorm statistics on every rank (a training forward leaves each rank its own),
  // then every rank's models, as raw bytes and as a hash: equal on every rank.
  g_model.prepare_forward();
  d_model.prepare_forward();
  std::string bytes;
  const uint64_t g_hash = append_state(*generator, bytes), d_hash = append_state(*discriminator, bytes);
  if (!flags.params_dir.empty()) {
    const std::string path = flags.params_dir + "/rank" + std::to_string(rank) + ".bin";
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw std::runtime_error("--params-dir: cannot write " + path);
  }
  // The gradient bytes each wrapper all-reduced, in parameter sizes per step of this run: 1 for
  // the generator, 2 for the discriminator (not 3: no_sync), 0 on one rank (nothing to average).
  const int64_t steps = std::max<int64_t>(1, step - resumed.position.step);
  auto per_step = [&](const ddp::DistributedDataParallel& model, const torch::nn::Module& module) {
    int64_t bytes = 0;
    for (const auto& p : module.parameters()) bytes += p.numel() * p.element_size();
    return static_cast<double>(model.sync_bytes()) / static_cast<double>(steps * bytes);
  };
  if (rank == 0) {
    std::printf("Training complete after step %ld: generator %016lx, discriminator %016lx\n",
                static_cast<long>(step), static_cast<unsigned long>(g_hash), static_cast<unsigned long>(d_hash));
    std::printf("Gradients all-reduced per step: generator %.2fx its parameters, discriminator %.2fx\n",
                per_step(g_model, *generator), per_step(d_model, *discriminator));
  }
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
  ddp::Runtime runtime(argc, argv, options);  // MPI up; rank, node, device
  if (!flag_error.empty() || flags.help) {
    if (runtime.is_main()) {
      if (flags.help) std::cout << kUsage << std::endl;
      else std::cerr << "ddp_dcgan: " << flag_error << " (see --help)" << std::endl;
    }
    return flags.help ? 0 : 2;
  }
  // An error on any rank ends the job, naming the rank.
  int status = 0;
  const int aborted = ddp::run_or_abort(runtime, [&] { status = train(flags, runtime); });
  return aborted ? aborted : status;
}

// A small CNN on MNIST-format images, trained data-parallel over MPI ranks: PyTorch's c10d C++
// example (pytorch/examples, cpp/distributed/dist-mnist.cpp) ported to ddp.
//
//   mpirun -np 2 ddp_dist_mnist --epochs 10 --checkpoint-dir ckpt --resume
//
// The same model (conv 1->10 k5, conv 10->20 k5 with dropout2d, fc 320->50 with dropout,
// fc 50->10, log_softmax), the same data (Normalize(0.1307, 0.3081), Stack), SGD at lr 0.01 and
// the same step (forward, nll_loss, backward, step). What a c10d user changes, each marked "ddp:"
// where it is:
//  - ddp::Runtime and ddp::ProcessGroup instead of c10d::ProcessGroupMPI;
//  - ddp::DistributedDataParallel instead of the loop that all-reduces each parameter's gradient
//    after backward, waits, and divides by the world size: the wrapper averages the gradients in
//    buckets, overlapped with the backward;
//  - ddp::DistributedSampler (PyTorch's DistributedSampler: a new shuffle every epoch, every
//    rank the same count of samples) instead of DistributedRandomSampler;
//  - a StepBoundary and a Checkpointer (the model and its optimizer): a stop signal on any rank
//    stops every rank before the same step (exit 75), and --resume continues bit for bit;
//  - the test set evaluated by every rank on its shard and summed, not by rank 0 alone.
// It builds against the installed package alone, as examples/ddp_dcgan.cpp does. Beyond the
// port: --batch-size is per rank (dist-mnist.cpp divides 64 by the world size), SGD has
// momentum 0.5 (as PyTorch's mnist.cpp; dist-mnist.cpp has none), the training loss and accuracy
// are averaged over the ranks and printed by rank 0 (dist-mnist.cpp prints each rank's
// accuracy), and flags for the tests (docs/porting.md).
//
// Everything random is a function of --seed: the weights, the data order, and the dropout masks
// (LibTorch's default generator, seeded alike on every rank as dist-mnist.cpp does, and kept per
// rank in the snapshots): on the CPU a run is the same bit for bit on every repeat at the same
// world size, and a --resume continues it exactly.

#include <ddp/train/train.h>

#include <torch/torch.h>

#include <algorithm>
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

// ---- Flags (ddp_dcgan's, less its sample flags) -------------------------------------------------

struct Flags {
  int64_t epochs = 10;
  int64_t batch_size = 64;           // per rank
  int64_t limit_train_batches = 0;   // 0: all
  int64_t workers = 2;               // DataLoader worker threads
  int64_t seed = 0;
  int64_t log_interval = 10;         // 0: no loss lines
  int64_t checkpoint_every_steps = 0;
  int64_t stop_at_step = 0;          // 0: none
  int64_t stop_rank = 0;
  std::string data_dir = ddp::kDefaultMnistDir;
  std::string checkpoint_dir;
  std::string params_dir;
  bool same_data = false;
  bool resume = false;
  bool no_cuda = false;
  bool help = false;
};

const char* const kUsage = R"(Usage: mpirun -np N ddp_dist_mnist [options]
PyTorch's c10d example dist-mnist.cpp: a small CNN on MNIST-format images, data-parallel.

  --epochs N                epochs to train (10)
  --batch-size N            training batch per rank (64)
  --limit-train-batches N   at most N batches (steps) per epoch (0: all)
  --workers N               DataLoader worker threads per rank (2)
  --seed N                  weights, data order and dropout (0)
  --data-dir D              MNIST-format IDX files, training and t10k, plain or .gz
                            (/usr/share/datasets/fashion-mnist)
  --log-interval N          steps between loss lines, averaged over the ranks (10; 0: none)
  --checkpoint-dir D        snapshots of the model and optimizer: at every epoch end (with the
                            weights, D/model_with_epoch<N>.pt) and on a stop signal (SIGTERM,
                            SIGUSR1, SIGUSR2: exit status 75)
  --checkpoint-every-steps N  also a snapshot every N steps (0: none)
  --resume                  continue from the newest snapshot in D, if there is one
  --same-data               every rank trains rank 0's batches: the ranks are identical replicas
                            of the 1-rank run, whose result they reproduce bit for bit (a test
                            of the averaging, not a way to train; resume it on as many ranks)
  --params-dir D            at the end each rank writes its parameters to D/rank<R>.bin, raw
                            bytes, for `cmp`
  --stop-at-step N          rehearse a preemption: rank --stop-rank raises SIGTERM on itself
                            after step N, so every rank stops at the next step (0: never)
  --stop-rank R             the rank that raises it (0)
  --no-cuda                 train on the CPU even when CUDA is available
  --help                    this text)";

// Parses "--name value" and "--name=value" (ddp_dcgan's parser). Throws std::invalid_argument
// naming the flag.
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
    else if (name == "--stop-at-step") f.stop_at_step = integer(0);
    else if (name == "--stop-rank") f.stop_rank = integer(0);
    else if (name == "--data-dir") f.data_dir = next();
    else if (name == "--checkpoint-dir") f.checkpoint_dir = next();
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

// ---- Data and model -----------------------------------------------------------------------------

// One split's images as float32 [1, 28, 28] in 0..1 with their labels (int64), read with the
// library's IDX reader (plain or .gz, any number of images): torch::data::datasets::MNIST's
// place, which reads only the uncompressed files of all 60000 and 10000.
class Mnist : public torch::data::datasets::Dataset<Mnist> {
 public:
  Mnist(const std::string& dir, const std::string& split)
      : images(ddp::read_idx(dir + "/" + split + "-images-idx3-ubyte").unsqueeze(1).to(torch::kFloat32).div_(255)),
        labels(ddp::read_idx(dir + "/" + split + "-labels-idx1-ubyte").to(torch::kInt64)) {}

  torch::data::Example<> get(size_t index) override {
    return {images[static_cast<int64_t>(index)], labels[static_cast<int64_t>(index)]};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(images.size(0)); }

  torch::Tensor images, labels;
};

// dist-mnist.cpp's Model: [B, 1, 28, 28] -> log-probabilities [B, 10].
struct Model : torch::nn::Module {
  Model()
      : conv1(torch::nn::Conv2dOptions(1, 10, 5)),
        conv2(torch::nn::Conv2dOptions(10, 20, 5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, 0.5, is_training());
    x = fc2->forward(x);
    return torch::log_softmax(x, 1);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};

int train(const Flags& flags, ddp::Runtime& runtime) {
  ddp::ProcessGroup group(runtime);  // ddp: instead of c10d::ProcessGroupMPI::createProcessGroupMPI()
  const torch::Device device = runtime.device();
  const int rank = runtime.rank(), world_size = runtime.world_size();
  if (flags.stop_rank >= world_size) {
    throw std::invalid_argument("--stop-rank " + std::to_string(flags.stop_rank) + " is not a rank of " +
                                std::to_string(world_size));
  }
  if (!flags.params_dir.empty()) std::filesystem::create_directories(flags.params_dir);
  // ddp: --same-data makes every rank rank 0 of a 1-rank run: its shard (all of it).
  const int data_rank = flags.same_data ? 0 : rank, data_ranks = flags.same_data ? 1 : world_size;

  auto train_dataset = Mnist(flags.data_dir, "train")
                           .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                           .map(torch::data::transforms::Stack<>());
  // ddp: PyTorch's DistributedSampler, reshuffled every epoch (start_epoch sets the epoch).
  ddp::DistributedSampler sampler(train_dataset.size().value(), data_ranks, data_rank, /*shuffle=*/true, flags.seed);

  // The same seed on every rank, as dist-mnist.cpp: the same initial weights (the wrapper
  // broadcasts rank 0's anyway) and the same dropout masks, which --same-data needs.
  torch::manual_seed(static_cast<uint64_t>(flags.seed));
  auto model = std::make_shared<Model>();
  model->to(device);
  // ddp: the wrapper averages the gradients over the ranks inside backward(): the whole of
  // dist-mnist.cpp's per-parameter all-reduce, wait and division, and its waitWork().
  ddp::DistributedDataParallel ddp_model(group, model);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));

  // ddp: the model (with the wrapper's state) and the optimizer in one snapshot; the step
  // boundary agrees on a stop signal and writes the snapshots. --same-data is recorded and
  // compared on --resume (the caller's setting).
  ddp::CheckpointerOptions checkpoints;
  checkpoints.dir = flags.checkpoint_dir;
  checkpoints.resume = flags.resume ? "latest" : "";
  checkpoints.every_steps = flags.checkpoint_every_steps;
  checkpoints.seed = flags.seed;
  checkpoints.batch_size = flags.batch_size;
  checkpoints.settings = {{"same_data", flags.same_data ? "true" : "false"}};
  ddp::StepBoundary boundary(group, ddp::Checkpointer(group, ddp_model, optimizer, checkpoints));
  ddp::ReporterOptions report;
  report.progress = ddp::ProgressMode::None;  // the loss lines are below
  ddp::Reporter reporter(group, report);      // for the line that says where the ranks stopped
  const ddp::ResumePoint& resumed = boundary.resume();  // collective: where to continue
  if (rank == 0) {
    std::cout << "Training dist-mnist's CNN on " << world_size << " rank(s)"
              << (flags.same_data ? " (the same data on each)" : "") << ", device " << device << ", "
              << flags.epochs << " epoch(s)" << std::endl;
  }

  int64_t step = resumed.position.step;
  for (int64_t epoch = resumed.position.epoch; epoch <= flags.epochs; ++epoch) {
    const ddp::EpochStart start = boundary.start_epoch(epoch, sampler, flags.batch_size);
    int64_t batches = start.batches(sampler, flags.batch_size);
    if (flags.limit_train_batches > 0) batches = std::min(batches, flags.limit_train_batches);
    auto data_loader = torch::data::make_data_loader(
        train_dataset, ddp::BatchRangeSampler(sampler, flags.batch_size, start.sampler_batch(start.first_batch),
                                              start.sampler_batch(batches)),
        torch::data::DataLoaderOptions().batch_size(flags.batch_size).workers(flags.workers));
    // This rank's epoch so far: correct guesses, samples, summed loss; kept in step snapshots
    // (RankState::values) so that a resumed epoch's accuracy counts its first part too.
    torch::Tensor counts = torch::zeros({3}, torch::kFloat64);
    if (start.rank_state.values.defined()) counts = start.rank_state.values.clone();
    int64_t batch_index = start.first_batch;
    for (auto& batch : *data_loader) {
      // ddp: the step boundary: every rank agrees whether to stop (a signal on any of them).
      if (boundary.at_step(batch_index, step, [&] { return ddp::RankState{{}, counts}; })) {
        reporter.stopped(boundary.stop(), boundary.position(), boundary.snapshot());
        return ddp::kStoppedExitCode;  // 75: saved; run the same command with --resume
      }
      torch::Tensor ip = batch.data.to(device), op = batch.target.to(device);
      model->zero_grad();
      // dist-mnist.cpp applies log_softmax a second time to the model's log-probabilities (a
      // no-op up to rounding); the loss here takes them as they are.
      torch::Tensor prediction = ddp_model.forward(ip);
      torch::Tensor loss = torch::nll_loss(prediction, op);
      loss.backward();  // ddp: the gradients arrive averaged over the ranks: no loop here
      optimizer.step();
      ++step;
      ++batch_index;
      if (flags.stop_at_step == step && flags.stop_rank == rank) std::raise(SIGTERM);

      counts[0] += prediction.argmax(1).eq(op).sum().item<double>();
      counts[1] += static_cast<double>(op.size(0));
      counts[2] += loss.item<double>() * static_cast<double>(op.size(0));
      if (flags.log_interval > 0 && batch_index % flags.log_interval == 0) {
        // ddp: the loss averaged over the ranks (collective: every rank, the same batches).
        torch::Tensor mean = loss.detach().to(torch::kCPU, torch::kFloat64).reshape({1});
        group.cpu().all_reduce(mean);
        if (rank == 0) {
          std::printf("[%2ld/%2ld][%3ld/%3ld] loss: %.4f\n", static_cast<long>(epoch), static_cast<long>(flags.epochs),
                      static_cast<long>(batch_index), static_cast<long>(batches), mean.item<double>() / world_size);
          std::fflush(stdout);
        }
      }
    }
    group.cpu().all_reduce(counts);  // ddp: the epoch's accuracy over all ranks' samples
    if (rank == 0) {
      std::printf("Epoch %ld: training loss %.4f, accuracy %.2f%%\n", static_cast<long>(epoch),
                  counts[2].item<double>() / counts[1].item<double>(),
                  100.0 * counts[0].item<double>() / counts[1].item<double>());
    }
    boundary.end_epoch();  // ddp: a stop signal in the epoch's last step stops before the next
    boundary.checkpointer().save_epoch(epoch, step);  // ddp: the epoch-end snapshot, collective
  }
  boundary.end_run(flags.epochs);  // ddp: rank 0 says if nothing was left, or a signal came too late

  // ddp: the test set on every rank, each its shard (every image once over the ranks), through
  // the module in eval() under NoGradGuard (no dropout; an eval forward needs no wrapper, so no
  // rank waits for another), and the sums reduced: the numbers of one process that evaluated
  // every image, in 1/world_size of the time, where dist-mnist.cpp keeps the other ranks idle
  // while rank 0 evaluates alone.
  Mnist test(flags.data_dir, "t10k");
  const std::vector<int64_t> shard = ddp::evaluation_shard(test.images.size(0), world_size, rank);
  torch::Tensor sums = torch::zeros({3}, torch::kFloat64);  // loss, correct, images
  {
    torch::NoGradGuard no_grad;
    model->eval();
    const torch::Tensor indices = torch::tensor(shard, torch::kInt64);
    for (int64_t from = 0; from < indices.size(0); from += 1000) {
      const torch::Tensor chunk = indices.slice(0, from, from + 1000);
      const torch::Tensor ip = ((test.images.index_select(0, chunk) - 0.1307) / 0.3081).to(device);
      const torch::Tensor op = test.labels.index_select(0, chunk).to(device);
      const torch::Tensor prediction = model->forward(ip);
      sums[0] += torch::nll_loss(prediction, op, {}, at::Reduction::Sum).item<double>();
      sums[1] += prediction.argmax(1).eq(op).sum().item<double>();
      sums[2] += static_cast<double>(chunk.size(0));
    }
    model->train();
  }
  group.cpu().all_reduce(sums);

  // Every rank's parameters, as raw bytes and as a hash (FNV-1a): equal on every rank. The
  // model has no buffers.
  std::string bytes;
  for (const auto& p : model->named_parameters()) {
    const torch::Tensor cpu = p.value().detach().to(torch::kCPU).contiguous();
    bytes += p.key() + '\n';
    bytes.append(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
  }
  uint64_t hash = 1469598103934665603ULL;
  for (const char c : bytes) hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211ULL;
  if (!flags.params_dir.empty()) {
    const std::string path = flags.params_dir + "/rank" + std::to_string(rank) + ".bin";
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw std::runtime_error("--params-dir: cannot write " + path);
  }
  if (rank == 0) {
    std::printf("Test set: %ld images, loss %.4f, accuracy %.2f%%\n", static_cast<long>(sums[2].item<double>()),
                sums[0].item<double>() / sums[2].item<double>(), 100.0 * sums[1].item<double>() / sums[2].item<double>());
    std::printf("Training complete after step %ld: model %016lx\n", static_cast<long>(step),
                static_cast<unsigned long>(hash));
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
  ddp::Runtime runtime(argc, argv, options);  // ddp: MPI up; rank, device (c10d: MPI_Init inside)
  if (!flag_error.empty() || flags.help) {
    if (runtime.is_main()) {
      if (flags.help) std::cout << kUsage << std::endl;
      else std::cerr << "ddp_dist_mnist: " << flag_error << " (see --help)" << std::endl;
    }
    return flags.help ? 0 : 2;
  }
  // ddp: an error on any rank ends the job, naming the rank (dist-mnist.cpp: pg->abort()).
  int status = 0;
  const int aborted = ddp::run_or_abort(runtime, [&] { status = train(flags, runtime); });
  return aborted ? aborted : status;
}

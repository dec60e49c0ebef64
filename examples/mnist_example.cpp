#include "mnist_example.h"

#include "mnist_cnn.h"

#include <ddp/ddp.h>

#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

namespace po = boost::program_options;

namespace {

struct Flags {
  int64_t batch_size, test_batch_size, epochs, log_interval, seed, limit_train_batches;
  double lr, gamma;
  bool save_model, no_cuda, dry_run, show_topology, find_unused_parameters;
  std::string data_dir, metrics_file, timeline, grad_sync, compression;
  double bucket_mb, first_bucket_mb;
};

po::options_description describe_flags(Flags& f) {
  po::options_description d("Options");
  d.add_options()
    ("help,h", "print this help and exit")
    ("batch-size", po::value(&f.batch_size)->default_value(64), "input batch size for training, per rank")
    ("test-batch-size", po::value(&f.test_batch_size)->default_value(1000), "input batch size for testing")
    ("epochs", po::value(&f.epochs)->default_value(14), "number of epochs to train")
    ("lr", po::value(&f.lr)->default_value(1.0), "learning rate")
    ("gamma", po::value(&f.gamma)->default_value(0.7), "learning rate step gamma")
    ("log-interval", po::value(&f.log_interval)->default_value(10), "how many batches to wait before logging training status")
    ("save-model", po::bool_switch(&f.save_model), "save the trained model to mnist_cnn.pt")
    ("seed", po::value(&f.seed)->default_value(1), "random seed (model init and data order)")
    ("no-cuda", po::bool_switch(&f.no_cuda), "train on the CPU even when CUDA is available")
    ("dry-run", po::bool_switch(&f.dry_run), "quickly check a single pass: one batch, one epoch")
    ("data-dir", po::value(&f.data_dir)->default_value(ddp::kDefaultMnistDir), "directory with the MNIST-format IDX files (.gz or raw)")
    ("limit-train-batches", po::value(&f.limit_train_batches)->default_value(0), "train on at most N batches per epoch (0: all)")
    ("metrics-file", po::value(&f.metrics_file)->default_value(""), "append one JSON object per epoch to this file")
    ("show-topology", po::bool_switch(&f.show_topology), "print every rank's place (node, local rank, device)")
    ("timeline", po::value(&f.timeline)->default_value(""), "write a Chrome-trace/Perfetto JSON of every rank's steps and all-reduces to this file")
    ("grad-sync", po::value(&f.grad_sync)->default_value("bucketed"), "gradient sync: bucketed (overlapped with backward) or per-parameter")
    ("bucket-mb", po::value(&f.bucket_mb)->default_value(25.0), "gradient bucket cap in MiB")
    ("first-bucket-mb", po::value(&f.first_bucket_mb)->default_value(1.0), "first gradient bucket cap in MiB")
    ("compression", po::value(&f.compression)->default_value("none"), "gradients on the wire: none, fp16 or bf16")
    ("find-unused-parameters", po::bool_switch(&f.find_unused_parameters), "count parameters without a gradient as zero instead of failing");
  return d;
}

int train(ddp::Runtime& runtime, const Flags& flags, Parallelism parallelism) {
  if (parallelism == Parallelism::SingleProcess && runtime.world_size() > 1) {
    throw std::runtime_error("mnist trains in one process but was started as " +
                             std::to_string(runtime.world_size()) +
                             " ranks: use ddp_mnist for data-parallel training");
  }
  if (flags.show_topology) {
    const auto lines = ddp::all_gather_strings(runtime.cpu_communicator(), runtime.summary());
    if (runtime.is_main()) {
      for (const auto& line : lines) std::cout << line << "\n";
    }
  }
  torch::manual_seed(static_cast<uint64_t>(flags.seed));
  const torch::Device device = runtime.device();
  // The whole data set lives on the training device; batches are gathered there.
  const ddp::ImageDataset train = ddp::load_mnist(flags.data_dir, ddp::MnistSplit::Train).to(device);
  const ddp::ImageDataset test = ddp::load_mnist(flags.data_dir, ddp::MnistSplit::Test).to(device);
  if (runtime.is_main()) {
    std::cout << "Train set size: " << train.size() << "\nTest set size: " << test.size()
              << "\nTraining on " << runtime.world_size() << " rank(s), " << runtime.num_nodes()
              << " node(s), device " << device << ", data " << flags.data_dir << std::endl;
  }

  std::unique_ptr<ddp::Timeline> timeline;
  if (!flags.timeline.empty()) timeline = std::make_unique<ddp::Timeline>(runtime.cpu_communicator());

  auto net = std::make_shared<MnistCnn>();
  net->to(device);
  std::unique_ptr<ddp::DistributedDataParallel> ddp_model;
  if (parallelism == Parallelism::DataParallel) {
    ddp::DDPOptions ddp_options;
    ddp_options.sync = ddp::parse_grad_sync(flags.grad_sync);
    ddp_options.compression = ddp::parse_compression(flags.compression);
    ddp_options.bucket_cap_mb = flags.bucket_mb;
    ddp_options.first_bucket_mb = flags.first_bucket_mb;
    ddp_options.find_unused_parameters = flags.find_unused_parameters;
    ddp_options.timeline = timeline.get();
    ddp_model = std::make_unique<ddp::DistributedDataParallel>(runtime, net, ddp_options);
  }
  ddp::Adadelta optimizer(net->parameters(), ddp::AdadeltaOptions(flags.lr));
  ddp::StepLR scheduler(optimizer, /*step_size=*/1, flags.gamma);

  ddp::TrainerOptions options;
  options.batch_size = flags.batch_size;
  options.test_batch_size = flags.test_batch_size;
  options.log_interval = flags.log_interval;
  options.limit_train_batches = flags.limit_train_batches;
  options.dry_run = flags.dry_run;
  options.seed = flags.seed;
  options.metrics_file = flags.metrics_file;
  options.timeline = timeline.get();
  ddp::Trainer trainer(runtime, *net, [&](const torch::Tensor& x) { return net->forward(x); },
                       optimizer, options, ddp_model.get());
  trainer.fit(train, test, flags.epochs, &scheduler);
  if (timeline) {
    timeline->write(flags.timeline);
    if (runtime.is_main()) std::cout << "Wrote the timeline to " << flags.timeline << std::endl;
  }

  if (flags.save_model && runtime.is_main()) {
    ddp::save_module(*net, "mnist_cnn.pt");
    std::cout << "Saved mnist_cnn.pt" << std::endl;
  }
  return 0;
}

}  // namespace

int run_mnist_example(int argc, char** argv, Parallelism parallelism) {
  Flags flags;
  const po::options_description options = describe_flags(flags);
  const char* name = parallelism == Parallelism::DataParallel ? "ddp_mnist" : "mnist";

  // Flags first: they decide the device the Runtime picks.
  po::variables_map vm;
  std::string flag_error;
  try {
    po::store(po::parse_command_line(argc, argv, options), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    flag_error = e.what();
  }
  ddp::RuntimeOptions runtime_options;
  runtime_options.use_cuda = flag_error.empty() && !flags.no_cuda;
  ddp::Runtime runtime(argc, argv, runtime_options);
  if (!flag_error.empty()) {
    // Every rank sees the same flags, so every rank stops here; rank 0 explains.
    if (runtime.is_main()) std::cerr << name << ": " << flag_error << " (see --help)\n";
    return 2;
  }
  if (vm.count("help")) {
    if (runtime.is_main()) {
      std::cout << "Usage: " << (parallelism == Parallelism::DataParallel ? "mpirun -np N " : "")
                << name << " [options]\n"
                << "Trains the seed MNIST CNN with Adadelta + StepLR"
                << (parallelism == Parallelism::DataParallel ? ", data-parallel over MPI ranks" : "")
                << ".\n\n" << options << "\n";
    }
    return 0;
  }
  int code = 0;
  ddp::run_or_abort(runtime, [&] { code = train(runtime, flags, parallelism); });
  return code;
}

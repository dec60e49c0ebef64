#include "cifar_example.h"

#include "cifar_cnn.h"
#include "resnet.h"

#include <ddp/cli/app.h>
#include <ddp/cli/data_placement.h>
#include <ddp/cli/finish.h>
#include <ddp/cli/flag_checks.h>
#include <ddp/cli/training_flags.h>
#include <ddp/train/train.h>

#include <boost/program_options.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace po = boost::program_options;

// The stop handlers from before LibTorch's static initialisers on: a SIGTERM or SIGUSR1 at any
// moment of start-up then ends the program with 75 (ddp/stop_signal.h), not 143 or 138.
DDP_STOP_HANDLERS_BEFORE_MAIN();

namespace {

struct CifarFlags {
  std::string model;
  double momentum = 0, weight_decay = 0, gamma = 0;
  int64_t step_size = 0;
  bool nesterov = false, sync_batchnorm = false, no_augment = false;
};

struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

Model make_model(const std::string& name) {
  if (name == "cnn") {
    auto net = CifarCnn();
    return {net.ptr(), [net](const torch::Tensor& x) mutable { return net->forward(x); }};
  }
  if (name == "resnet18") {
    auto net = ResNet18();
    return {net.ptr(), [net](const torch::Tensor& x) mutable { return net->forward(x); }};
  }
  throw std::invalid_argument("--model '" + name + "' is not one of: cnn, resnet18");
}

}  // namespace

int run_cifar_example(int argc, char** argv, ddp::cli::Parallelism parallelism,
                      const std::function<void(ddp::TrainerOptions&)>& adjust) {
  const bool parallel = parallelism == ddp::cli::Parallelism::DataParallel;
  const ddp::cli::TrainingDefaults defaults{
      128, 30, 0.1, ddp::kDefaultCifar10Dir,
      "directory with CIFAR-10's binary files (scripts/download_cifar10.sh)", "cifar_model.pt",
      "cosine"};
  ddp::cli::TrainingFlags flags;
  CifarFlags cifar;
  po::options_description options("Model and optimizer");
  ddp::cli::add_training_flags(options, flags, defaults);
  options.add_options()
    ("model", po::value(&cifar.model)->default_value("resnet18"), "cnn (small, 0.8 M parameters) or resnet18 (11.2 M)")
    ("momentum", po::value(&cifar.momentum)->default_value(0.9, "0.9"), "SGD momentum")
    ("nesterov", po::bool_switch(&cifar.nesterov), "Nesterov momentum")
    ("weight-decay", po::value(&cifar.weight_decay)->default_value(5e-4, "5e-4"), "SGD weight decay (L2)")
    ("step-size", po::value(&cifar.step_size)->default_value(30), "step schedule: epochs between decays")
    ("gamma", po::value(&cifar.gamma)->default_value(0.1, "0.1"), "step schedule: decay factor")
    ("sync-batchnorm", po::bool_switch(&cifar.sync_batchnorm), "BatchNorm statistics over all ranks' batches (SyncBatchNorm)")
    ("no-augment", po::bool_switch(&cifar.no_augment), "train without random crops and flips");

  const std::string usage =
      std::string("Trains a CIFAR-10 CNN or ResNet-18 with SGD, augmentation and checkpoints") +
      (parallel ? ", data-parallel over MPI ranks" : "") + ".";
  const ddp::cli::Program program{parallel ? "ddp_cifar" : "cifar", usage, parallelism,
                                  "ddp_cifar"};
  return ddp::cli::run(argc, argv, program, options, flags, [&](ddp::ProcessGroup& group) {
    const torch::Device device = group.device();
    ddp::ImageDataset train = ddp::load_cifar10(flags.data_dir, ddp::CifarSplit::Train);
    ddp::ImageDataset test = ddp::load_cifar10(flags.data_dir, ddp::CifarSplit::Test);
    ddp::cli::place_data(group, train, test, flags.data_dir);

    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    Model model = make_model(cifar.model);
    model.module->to(device);
    if (cifar.sync_batchnorm && parallel) {
      const int layers =
          ddp::convert_sync_batchnorm(*model.module, group.for_device(device));
      if (group.is_main()) std::cout << "SyncBatchNorm: " << layers << " layers" << std::endl;
    }
    const auto timeline = ddp::cli::make_timeline(group, flags);
    torch::optim::SGD optimizer(model.module->parameters(),
                                torch::optim::SGDOptions(flags.lr)
                                    .momentum(cifar.momentum)
                                    .nesterov(cifar.nesterov)
                                    .weight_decay(cifar.weight_decay));
    const auto ddp_model =
        ddp::cli::make_ddp(group, model.module, flags, parallelism, timeline.get(), optimizer);
    const ddp::cli::Schedules schedules = ddp::cli::make_schedules(
        flags, optimizer, train.size(), group.size(), cifar.step_size, cifar.gamma);

    ddp::cli::check_batch_memory(group, flags, *model.module, model.forward, {3, 32, 32},
                                 train.size(), test.size());
    ddp::TrainerOptions options = ddp::cli::trainer_options(flags, timeline.get());
    options.lr_schedule = schedules.per_step.get();
    options.report.format = std::make_shared<ddp::ClassificationFormat>();  // the seed's lines
    if (adjust) adjust(options);
    ddp::Augment augment;
    if (!cifar.no_augment) augment = ddp::RandomCropFlip{4, true};
    ddp::ClassificationTask task(train, &test, model.forward, augment);
    ddp::Trainer trainer(group, *model.module, task, optimizer, options, ddp_model.get());
    trainer.fit(flags.epochs, schedules.per_epoch.get());
    return ddp::cli::finish(group, flags, defaults, timeline.get(), *model.module, trainer);
  }, [&] {
    if (cifar.model != "cnn" && cifar.model != "resnet18") {
      throw std::invalid_argument("--model '" + cifar.model + "' is not one of: cnn, resnet18");
    }
    ddp::cli::require_at_least("--step-size", cifar.step_size, 1);
    if (cifar.step_size > int64_t{UINT32_MAX}) {  // StepLR takes an unsigned
      throw std::invalid_argument("--step-size must be <= " + std::to_string(UINT32_MAX) +
                                  " (got " + std::to_string(cifar.step_size) + ")");
    }
    ddp::cli::require_finite("--momentum", cifar.momentum, 0, /*least_allowed=*/true);
    ddp::cli::require_finite("--weight-decay", cifar.weight_decay, 0, true);
    ddp::cli::require_finite("--gamma", cifar.gamma, 0, true);
  });
}

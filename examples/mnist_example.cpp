#include "mnist_example.h"

#include "mnist_cnn.h"

#include <ddp/cli/app.h>
#include <ddp/cli/data_placement.h>
#include <ddp/cli/finish.h>
#include <ddp/cli/flag_checks.h>
#include <ddp/cli/training_flags.h>
#include <ddp/train/train.h>

#include <boost/program_options.hpp>

#include <memory>

namespace po = boost::program_options;

// The stop handlers from before LibTorch's static initialisers on: a SIGTERM or SIGUSR1 at any
// moment of start-up then ends the program with 75 (ddp/stop_signal.h), not 143 or 138.
DDP_STOP_HANDLERS_BEFORE_MAIN();

int run_mnist_example(int argc, char** argv, ddp::cli::Parallelism parallelism,
                      const std::function<void(ddp::TrainerOptions&)>& adjust) {
  const ddp::cli::TrainingDefaults defaults{
      64, 14, 1.0, ddp::kDefaultMnistDir, "directory with the MNIST-format IDX files (.gz or raw)",
      "mnist_cnn.pt"};
  ddp::cli::TrainingFlags flags;
  double gamma = 0.7;
  bool no_dropout = false;
  po::options_description options("Model and optimizer");
  ddp::cli::add_training_flags(options, flags, defaults);
  options.add_options()
    ("gamma", po::value(&gamma)->default_value(0.7, "0.7"), "learning rate step gamma")
    ("no-dropout", po::bool_switch(&no_dropout), "the CNN without dropout (both rates 0): dropout draws per rank, so only then do runs that split the same global batches over other numbers of ranks train the same model");

  const bool parallel = parallelism == ddp::cli::Parallelism::DataParallel;
  const std::string usage = std::string("Trains the seed MNIST CNN with Adadelta + StepLR") +
                            (parallel ? ", data-parallel over MPI ranks" : "") + ".";
  const ddp::cli::Program program{parallel ? "ddp_mnist" : "mnist", usage, parallelism,
                                  "ddp_mnist"};
  return ddp::cli::run(argc, argv, program, options, flags, [&](ddp::ProcessGroup& group) {
    const torch::Device device = group.device();
    ddp::ImageDataset train = ddp::load_mnist(flags.data_dir, ddp::MnistSplit::Train);
    ddp::ImageDataset test = ddp::load_mnist(flags.data_dir, ddp::MnistSplit::Test);
    ddp::cli::place_data(group, train, test, flags.data_dir);

    const auto timeline = ddp::cli::make_timeline(group, flags);
    // The seed, then the model: every rank builds the same weights and draws its dropout masks
    // from the same generator state.
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    auto net = std::make_shared<MnistCnn>();
    if (no_dropout) {
      net->dropout1->options.p(0);
      net->dropout2->options.p(0);
    }
    net->to(device);
    // Adadelta updates each parameter from its own gradient and state: --overlap-step may step it.
    ddp::Adadelta optimizer(net->parameters(), ddp::AdadeltaOptions(flags.lr));
    const auto ddp_model =
        ddp::cli::make_ddp(group, net, flags, parallelism, timeline.get(), optimizer);
    // The seeds' StepLR every epoch by --gamma, unless --schedule or --warmup-steps say otherwise.
    const ddp::cli::Schedules schedules = ddp::cli::make_schedules(
        flags, optimizer, train.size(), group.size(), /*step_size=*/1, gamma);

    ddp::cli::check_batch_memory(group, flags, *net,
                                 [&](const torch::Tensor& x) { return net->forward(x); },
                                 {1, 28, 28}, train.size(), test.size());
    ddp::TrainerOptions options = ddp::cli::trainer_options(flags, timeline.get());
    options.lr_schedule = schedules.per_step.get();
    options.report.format = std::make_shared<ddp::ClassificationFormat>();  // the seed's lines
    if (adjust) adjust(options);
    ddp::ClassificationTask task(train, &test, [&](const torch::Tensor& x) { return net->forward(x); });
    ddp::Trainer trainer(group, *net, task, optimizer, options, ddp_model.get());
    trainer.fit(flags.epochs, schedules.per_epoch.get());
    return ddp::cli::finish(group, flags, defaults, timeline.get(), *net, trainer);
  }, [&] { ddp::cli::require_finite("--gamma", gamma, 0, /*least_allowed=*/true); });
}

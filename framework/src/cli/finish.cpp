#include <ddp/cli/finish.h>

#include <ddp/checkpoint_file.h>
#include <ddp/stop_signal.h>

#include <iostream>

namespace ddp::cli {

int finish(ddp::ProcessGroup& group, const TrainingFlags& flags, const TrainingDefaults& defaults,
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

int run_training(ddp::ProcessGroup& group, const std::function<int(ddp::ProcessGroup&)>& train) {
  try {
    return train(group);
  } catch (const ddp::TrainingDiverged& e) {
    if (group.is_main()) {
      std::cout << std::flush;
      std::cerr << e.what() << "\nExit status " << ddp::kDivergedExitCode
                << ": training diverged (try a lower --lr, --clip-grad-norm, or --on-nonfinite "
                   "skip to drop such steps)"
                << std::endl;
    }
    return ddp::kDivergedExitCode;
  } catch (const ddp::GlobalBatchNotDivisible& e) {
    // Thrown on every rank alike, after the snapshot was read: a usage error, as a bad flag.
    if (group.is_main()) {
      const int64_t global = e.snapshot_batch_size() * e.snapshot_ranks();
      std::cout << std::flush;
      std::cerr << "--keep-global-batch: the snapshot's global batch of " << global << " ("
                << e.snapshot_batch_size() << " per rank x " << e.snapshot_ranks()
                << " ranks) does not divide among " << e.ranks() << " ranks: run on a number of "
                << "ranks that divides " << global << ", or leave out --keep-global-batch to "
                << "keep --batch-size per rank" << std::endl;
    }
    return 2;
  }
}

}  // namespace ddp::cli

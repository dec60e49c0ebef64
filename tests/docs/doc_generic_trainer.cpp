// docs/training_loop.md's "Trainer with your own task" block, as a reader pastes it: CMake copies
// the block into doc_generic_trainer.inc (tests/CMakeLists.txt), so a change to the doc that no
// longer compiles fails the build. Run at 2 ranks: the loss falls over 3 epochs, the metric is
// reported over all samples, and both ranks end with the same weights.
#include <ddp/train/train.h>

#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace doc {
#include "doc_generic_trainer.inc"
}  // namespace doc

int main(int argc, char** argv) {
  ddp::Runtime runtime(argc, argv);
  return ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroup group(runtime);
    torch::manual_seed(5);
    const torch::Tensor x1 = torch::randn({64, 3}), x2 = torch::randn({64, 2});
    const torch::Tensor y = x1.sum(1, true) - 0.5 * x2.sum(1, true);
    const std::vector<ddp::EpochResult> r = doc::train_regression(group, doc::Rows{x1, x2, y});
    auto require = [](bool ok, const std::string& what) {
      if (!ok) throw std::runtime_error("docs/training_loop.md example: " + what);
    };
    require(r.size() == 3, "3 epochs expected, got " + std::to_string(r.size()));
    require(r[2].train_loss < r[0].train_loss,
            "the train loss did not fall: " + std::to_string(r[0].train_loss) + " -> " +
                std::to_string(r[2].train_loss));
    require(r[2].samples == 64,
            "64 samples per epoch expected, got " + std::to_string(r[2].samples));
    require(r[2].train_metrics.size() == 1 && r[2].train_metrics[0].name == "abs_error" &&
                r[2].train_metrics[0].samples == 64 && r[2].train_metrics[0].sum > 0,
            "the abs_error metric is missing or not over all 64 samples");
    if (group.is_main()) {
      std::printf("doc example OK: train loss %.4f -> %.4f, abs_error mean %.4f\n", r[0].train_loss,
                  r[2].train_loss, r[2].train_metrics[0].mean());
    }
  });
}

#pragma once
// What the example programs (mnist, ddp_mnist, cifar, ddp_cifar) share: the flags every one of
// them has, the start-up order (flags, then the Runtime, which needs --no-cuda, then --help),
// and turning those flags into DistributedDataParallel and Trainer options. Each program adds
// only its data set, model, optimizer and schedule.

#include <ddp/ddp.h>

#include <boost/program_options.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

enum class Parallelism { SingleProcess, DataParallel };

struct CommonFlags {
  int64_t batch_size = 0, test_batch_size = 0, epochs = 0, log_interval = 0, seed = 0;
  int64_t limit_train_batches = 0, check_sync_every = 0, keep_checkpoints = 0;
  int64_t checkpoint_every_steps = 0;
  int64_t replicas_per_process = 0;  // 0: the default (RuntimeOptions::replicas_per_process)
  double lr = 0, bucket_mb = 0, first_bucket_mb = 0;
  bool save_model = false, no_cuda = false, dry_run = false, show_topology = false;
  bool find_unused_parameters = false, no_broadcast_buffers = false, resume_fallback = false;
  std::string data_dir, metrics_file, timeline, grad_sync, compression, backend, checkpoint_dir, resume;
  std::string progress;
  // The training step (issue 13).
  int64_t accumulate = 1, warmup_steps = 0;
  int64_t scale_lr_with_batch = 0;  // --scale-lr-with-batch REFERENCE; 0: off
  double clip_grad_norm = 0;
  std::string amp, schedule;
  std::optional<double> timeout;  // --timeout, when given
};

// The defaults that differ between programs.
struct ExampleDefaults {
  int64_t batch_size;
  int64_t epochs;
  double lr;
  std::string data_dir;
  std::string data_help;   // what --data-dir holds
  std::string model_file;  // what --save-model writes
  std::string schedule = "step";  // --schedule's default: cosine or step
};

// Adds --help to `options`, and the shared flags in groups by topic (training, data, distributed,
// checkpoints, progress and diagnostics), storing into `flags`.
void add_common_flags(boost::program_options::options_description& options, CommonFlags& flags,
                      const ExampleDefaults& defaults);

// The whole program around `train`: parses `options` (which holds the common flags and the
// program's own), starts the Runtime, answers --help with `usage`, refuses several ranks (or
// replicas) for a SingleProcess program, prints the topology when asked, and runs `train` under
// run_or_abort, once per replica of the process (ddp::run_replicas: --replicas-per-process).
// Returns the exit code: `train`'s (finish()'s) when it returns.
// `check_flags` (optional) checks the program's own flags after parsing, throwing
// std::invalid_argument naming the flag; like a bad common flag, that ends the program with
// status 2 before any data is read.
int run_example(int argc, char** argv, const std::string& name, const std::string& usage,
                Parallelism parallelism, const boost::program_options::options_description& options,
                const CommonFlags& flags, const std::function<int(ddp::ProcessGroup&)>& train,
                const std::function<void()>& check_flags = {});

// Throws std::invalid_argument naming the flag when the common flags are out of range: sizes
// and counts below their least value, --lr and the bucket sizes not finite and > 0,
// --resume without --checkpoint-dir, --resume-fallback without --resume, --timeout not finite
// and > 0 (and at most 10^7 s).
void check_common_flags(const CommonFlags& flags);

// For the programs' own flags: `value` >= `least`; a finite `value` > `least` (>= with
// `least_allowed`). Throw std::invalid_argument naming `flag` and the value.
void require_at_least(const char* flag, int64_t value, int64_t least);
void require_finite(const char* flag, double value, double least, bool least_allowed);

// Refuses, before training, a --batch-size or --test-batch-size whose batches cannot fit in
// the host memory left for this node's ranks (ddp/train/memory_check.h: a lower bound measured
// with one forward of `model` on samples of `sample_shape`, e.g. {1, 28, 28}). A batch holds at
// most a replica's shard of the train (test) set of `train_size` (`test_size`) samples; the
// node's replicas share the memory. Nothing is checked for a GPU.
void check_batch_memory(ddp::ProcessGroup& group, const CommonFlags& flags, torch::nn::Module& model,
                        const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                        const std::vector<int64_t>& sample_shape, int64_t train_size,
                        int64_t test_size);

// Puts the loaded train and test sets where training on group.device() reads them: each moved to
// that device when it fits there (ddp::fits_on; the train set first, the test set against what
// is left), else left in host memory, from which each batch is copied one step ahead. Each rank
// decides for its own device; the batches are the same either way. Replica 0 says where each set
// went, their sizes and where training runs (`data_dir` names where they came from).
void place_data(ddp::ProcessGroup& group, ddp::ImageDataset& train, ddp::ImageDataset& test,
                const std::string& data_dir);

// Null with --timeline unset.
std::unique_ptr<ddp::Timeline> make_timeline(ddp::ProcessGroup& group, const CommonFlags& flags);

// The data-parallel wrapper the flags describe, or null for a SingleProcess program.
std::unique_ptr<ddp::DistributedDataParallel> make_ddp(
    ddp::ProcessGroup& group, std::shared_ptr<torch::nn::Module> model, const CommonFlags& flags,
    Parallelism parallelism, ddp::Timeline* timeline);

ddp::TrainerOptions trainer_options(const CommonFlags& flags, ddp::Timeline* timeline);
// The learning-rate schedule of --schedule on `optimizer`. Without --warmup-steps: per epoch, as
// the seeds do (cosine over --epochs: CosineAnnealingLR; step: StepLR every `step_size` epochs
// by `gamma`). With --warmup-steps N: per optimizer step (ddp::LRSchedule), a linear warmup over
// N steps, then the cosine over the remaining steps of --epochs or the same step decay counted
// in steps; the steps come from the shard of `train_size` samples, --batch-size,
// --limit-train-batches and --accumulate. Exactly one of the two is set.
struct Schedules {
  std::unique_ptr<torch::optim::LRScheduler> per_epoch;  // for Trainer::fit
  std::unique_ptr<ddp::LRSchedule> per_step;             // for TrainerOptions::lr_schedule
};
Schedules make_schedules(const CommonFlags& flags, torch::optim::Optimizer& optimizer,
                         int64_t train_size, int world_size, int64_t step_size, double gamma);

// After training: writes the timeline and, with --save-model, the weights (rank 0). Returns the
// exit code: 0, or ddp::kStoppedExitCode when a stop signal ended training early (no model is
// saved then: it is not trained yet).
int finish(ddp::ProcessGroup& group, const CommonFlags& flags, const ExampleDefaults& defaults,
           ddp::Timeline* timeline, const torch::nn::Module& model, const ddp::Trainer& trainer);

#include <ddp/cli/data_placement.h>

#include <ddp/runtime.h>
#include "cli/memory_check.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

namespace ddp::cli {

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
              << "\nTraining on " << group.size() << " rank(s), " << runtime.num_nodes()
              << " node(s), device " << group.device() << ", data " << data_dir << std::endl;
  }
}

void check_batch_memory(ddp::ProcessGroup& group, const TrainingFlags& flags,
                        torch::nn::Module& model,
                        const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                        const std::vector<int64_t>& sample_shape, int64_t train_size,
                        int64_t test_size) {
  // Host memory only: on a GPU the batch lives in the device's memory (not estimated yet).
  if (group.device().is_cuda()) return;
  const ddp::HostMemory memory = ddp::host_memory_available();
  // A batch holds at most this rank's shard (the sampler pads shards to the same size).
  const int64_t ranks = group.size();
  // Every rank on the node holds its batch at once.
  const int local = group.runtime().local_size();
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

}  // namespace ddp::cli

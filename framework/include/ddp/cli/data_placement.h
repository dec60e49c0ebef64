#pragma once
/// \file
/// Before training on in-memory image data: where the train and test sets go (the device, or host
/// memory with batches copied one step ahead), and whether --batch-size and --test-batch-size can
/// fit in the host memory left, so that a batch too large is refused before any training.

#include <ddp/cli/training_flags.h>
#include <ddp/train/image_dataset.h>
#include <ddp/process_group.h>

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp::cli {

/// Puts the loaded train and test sets where training on group.device() reads them: each moved to
/// that device when it fits there (ddp::fits_on; the train set first, the test set against what
/// is left), else left in host memory, from which each batch is copied one step ahead. Each rank
/// decides for its own device; the batches are the same either way. Rank 0 says where each set
/// went, their sizes and where training runs (`data_dir` names where they came from).
void place_data(ddp::ProcessGroup& group, ddp::ImageDataset& train, ddp::ImageDataset& test,
                const std::string& data_dir);

/// Refuses, before training, a --batch-size or --test-batch-size whose batches cannot fit in the
/// host memory left for this node's ranks (src/cli/memory_check.h: a lower bound, from one forward
/// of `model` on samples of `sample_shape`, e.g. {1, 28, 28}). Nothing is checked for a GPU.
void check_batch_memory(ddp::ProcessGroup& group, const TrainingFlags& flags,
                        torch::nn::Module& model,
                        const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                        const std::vector<int64_t>& sample_shape, int64_t train_size,
                        int64_t test_size);

}  // namespace ddp::cli

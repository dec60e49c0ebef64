#pragma once
// save_snapshot and load_snapshot with this rank's CUDA generator state handed over explicitly,
// so that the entry's format is tested on the CPU with a made-up state.

#include <ddp/train/snapshot.h>

namespace ddp::detail {

// This rank's CUDA generator state from a snapshot.
struct SavedCudaGenerator {
  bool in_file = false;  // the snapshot has the entry (its ranks computed on CUDA)
  torch::Tensor state;   // this rank's row; undefined without the entry or at another world size
};

// save_snapshot, with `cuda_generator_state` (uint8; undefined: this rank computes on the CPU) as
// this rank's. Collective; every rank must hand in a state of the same size, or none.
void save_snapshot_with(const std::string& path, Communicator& comm, const SnapshotParts& parts,
                        const TrainingProgress& progress, const RankState& rank_state,
                        const TrainingExtras& extras, const torch::Tensor& cuda_generator_state);

// load_snapshot without touching any CUDA generator: this rank's saved state goes to `cuda`.
TrainingProgress load_snapshot_with(const std::string& path, Communicator& comm,
                                    const SnapshotParts& parts,
                                    torch::optim::LRScheduler* scheduler, RankState* rank_state,
                                    const TrainingExtras& extras, SavedCudaGenerator& cuda);

}  // namespace ddp::detail

#pragma once
// The parts of a snapshot beyond the model, the optimizer and the position (snapshot.h): the
// DistributedDataParallel wrapper's state, every rank's, and the settings that shaped the run.

#include <ddp/communicator.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/snapshot.h>

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <string>

namespace ddp::detail {

// Every rank's DistributedDataParallel::save_state as uint8 rows padded to the longest, with
// their lengths: [ranks, longest] and [ranks] on every rank. Collective.
struct GatheredStates {
  torch::Tensor bytes, lengths;
};
GatheredStates gather_ddp_states(Communicator& comm, const DistributedDataParallel& ddp);
// Whether `states`, as read from a file, are rows of bytes for `ranks` ranks.
bool well_formed(const GatheredStates& states, int ranks);

// Restores `ddp` from the gathered rows of a snapshot written by `saved_ranks` ranks: this rank's
// row on as many ranks, rank 0's otherwise (then the hook's per-rank state is not restored).
// Returns what was not restored ("" when everything was). Collective.
std::string restore_ddp_state(DistributedDataParallel& ddp, const GatheredStates& saved,
                              int saved_ranks, int rank, int ranks);

// What must match for a snapshot to fit the parts: every parameter and buffer of each module, in
// order, one per line (a named module's lines start with "<name>: ").
std::string describe_parts(const SnapshotParts& parts);
// The optimizers' types: the one model's type, or "<name>=<type>" for each, joined by ", ".
std::string optimizer_types(const SnapshotParts& parts);
// Write each module's (rank 0) and each optimizer's state (every rank: a sharded optimizer's
// save() is collective) into the snapshot's "model" and "optimizer" entries: the one model's
// directly, named ones as an archive each.
void write_modules(torch::serialize::OutputArchive& modules, const SnapshotParts& parts);
void write_optimizers(torch::serialize::OutputArchive& optimizers, const SnapshotParts& parts);
// The reverse, copying into the modules' tensors (load_module); `scheduler` (may be null) is
// stepped `epochs` times before the optimizers' state is loaded, and the rates it set are kept
// (with one optimizer).
void read_parts(torch::serialize::InputArchive& modules, torch::serialize::InputArchive& optimizers,
                const SnapshotParts& parts, torch::optim::LRScheduler* scheduler, int64_t epochs);

// The settings as one text entry ("name\tvalue" lines) and back; a tab or a newline inside a
// name or value becomes a space.
std::string encode_settings(const Settings& settings);
Settings decode_settings(const std::string& text);

}  // namespace ddp::detail

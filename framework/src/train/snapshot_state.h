#pragma once
// The parts of a snapshot beyond the model, the optimizer and the position (snapshot.h): the
// DistributedDataParallel wrapper's state, every rank's, and the settings that shaped the run.

#include <ddp/communicator.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/train/snapshot.h>

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace ddp::detail {

// A wrapper of a module that a snapshot holds, and which one (`key`): "" the one model, else a
// part's name; then ".<path>" for a module inside it (its dotted name in named_modules()).
struct SavedWrapper {
  std::string key;
  DistributedDataParallel* ddp = nullptr;
};
// The live wrappers (DistributedDataParallel::live_wrappers) of the parts' modules and of modules inside
// them, in the parts' order, then each part's named_modules() order: the same on every rank. Local.
// Throws std::runtime_error starting with `who` and naming the wrapper's module where a wrapper
// whose comm hook keeps state (DistributedDataParallel::comm_hook_has_state) wraps a module that
// is neither a part nor inside one (a model the snapshot does not hold, or one that holds a part
// and more): that state could not be restored, and the resume would differ silently. Also where
// two live wrappers wrap one module of the parts.
std::vector<SavedWrapper> wrappers_of(const SnapshotParts& parts, const std::string& who);
// What a message calls the wrapper of `key`: "the model's wrapper", "<key>'s wrapper".
std::string wrapper_name(const std::string& key);

// Every rank's DistributedDataParallel::save_state as uint8 rows padded to the longest, with
// their lengths: [ranks, longest] and [ranks] on every rank. Collective.
struct GatheredStates {
  torch::Tensor bytes, lengths;
};
GatheredStates gather_ddp_states(Communicator& comm, const DistributedDataParallel& ddp);
// Whether `states`, as read from a file, are rows of bytes for `ranks` ranks.
bool well_formed(const GatheredStates& states, int ranks);
// The comm hook description in `states`' first row when that row holds the hook's state, else "".
std::string saved_stateful_hook(const GatheredStates& states);

// The wrappers' states in a snapshot: "ddp_wrappers", their keys one a line, and each one's rows
// as "ddp_states" (the first: where a file of one model's one wrapper has always had them) and
// "ddp_states_<i>". Reading gives them by key; an older file's "ddp_states" alone is the one
// model's (key ""). Reading throws c10::Error on an archive without the entries it names.
using KeyedStates = std::vector<std::pair<std::string, GatheredStates>>;
void write_wrapper_states(torch::serialize::OutputArchive& archive, const KeyedStates& states);
KeyedStates read_wrapper_states(torch::serialize::InputArchive& archive);

// Restores `ddp` from the gathered rows of a snapshot written by `saved_ranks` ranks: this rank's
// row on as many ranks, rank 0's otherwise (then the hook's per-rank state is not restored).
// Returns what was not restored ("" when everything was). Collective.
std::string restore_ddp_state(DistributedDataParallel& ddp, const GatheredStates& saved,
                              int saved_ranks, int rank, int ranks);
// Restores each of `live` from its key's rows in `saved`; returns what was not restored, one line
// each: a wrapper's own (restore_ddp_state), a wrapper with a stateful hook that `saved` holds
// nothing of, a saved hook state that no live wrapper takes. Collective.
std::vector<std::string> restore_wrappers(const std::vector<SavedWrapper>& live,
                                          const KeyedStates& saved, int saved_ranks, int rank,
                                          int ranks);

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

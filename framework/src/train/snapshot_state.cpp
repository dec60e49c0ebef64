#include "train/snapshot_state.h"

#include <ddp/checkpoint_file.h>

#include "util/tensor_description.h"

#include <c10/util/Type.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <typeinfo>
#include <unordered_set>
#include <vector>

namespace ddp::detail {

namespace {

std::string flattened(std::string text) {
  std::replace(text.begin(), text.end(), '\t', ' ');
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

bool one_model(const SnapshotParts& parts) {
  return parts.modules.size() == 1 && parts.modules[0].first.empty() &&
         parts.optimizers.size() == 1 && parts.optimizers[0].first.empty();
}

template <typename Named>
void check_names(const Named& named, const char* kind, const std::string& who, bool one) {
  if (named.empty()) throw std::invalid_argument(who + ": no " + kind);
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].first;
    if (named[i].second == nullptr)
      throw std::invalid_argument(who + ": the " + kind + " \"" + name + "\" is null");
    if (one) continue;
    const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
    const bool unique = std::none_of(named.begin(), named.begin() + i,
                                     [&](const auto& n) { return n.first == name; });
    if (!valid || !unique) {
      throw std::invalid_argument(who + ": the " + kind + " name \"" + name + "\" must be " +
                                  (valid ? "unique" : "made of letters, digits and '_'") +
                                  " (\"\" only for one model with one optimizer)");
    }
  }
}

}  // namespace

std::string describe_parts(const SnapshotParts& parts) {
  std::string text;
  for (const auto& [name, module] : parts.modules) {
    for (const auto& line : describe_tensors(*module))
      text += (name.empty() ? "" : name + ": ") + line + "\n";
  }
  return text;
}

std::string optimizer_types(const SnapshotParts& parts) {
  std::string text;
  for (const auto& [name, optimizer] : parts.optimizers) {
    const std::string type = c10::demangle(typeid(*optimizer).name());
    text += (text.empty() ? "" : ", ") + (name.empty() ? type : name + "=" + type);
  }
  return text;
}

void write_modules(torch::serialize::OutputArchive& modules, const SnapshotParts& parts) {
  if (one_model(parts)) {
    parts.modules[0].second->save(modules);
    return;
  }
  for (const auto& [name, module] : parts.modules) {
    torch::serialize::OutputArchive part;
    module->save(part);
    modules.write(name, part);
  }
}

void write_optimizers(torch::serialize::OutputArchive& optimizers, const SnapshotParts& parts) {
  if (one_model(parts)) {
    parts.optimizers[0].second->save(optimizers);
    return;
  }
  for (const auto& [name, optimizer] : parts.optimizers) {
    torch::serialize::OutputArchive part;
    optimizer->save(part);
    optimizers.write(name, part);
  }
}

void read_parts(torch::serialize::InputArchive& modules, torch::serialize::InputArchive& optimizers,
                const SnapshotParts& parts, torch::optim::LRScheduler* scheduler, int64_t epochs) {
  const bool one = one_model(parts);
  for (const auto& [name, module] : parts.modules) {
    torch::serialize::InputArchive part;
    if (!one) modules.read(name, part);
    load_module(*module, one ? modules : part);  // copies: the DDP hooks stay attached
  }
  // Replayed over this run's optimizer, the scheduler leaves this run's rates for the epoch the
  // run resumes in; they are kept over the snapshot's, which equal them unless the schedule
  // changed (--epochs, --lr). With several optimizers LibTorch does not say which one the
  // scheduler drives, so theirs stay the snapshot's.
  std::vector<double> scheduled;
  if (scheduler) {
    for (int64_t e = 0; e < epochs; ++e) scheduler->step();
    if (parts.optimizers.size() == 1) {
      for (const auto& group : parts.optimizers[0].second->param_groups())
        scheduled.push_back(group.options().get_lr());
    }
  }
  for (const auto& [name, optimizer] : parts.optimizers) {
    torch::serialize::InputArchive part;
    if (!one) optimizers.read(name, part);
    optimizer->load(one ? optimizers : part);
  }
  if (!scheduled.empty()) {
    auto& groups = parts.optimizers[0].second->param_groups();
    for (size_t g = 0; g < groups.size() && g < scheduled.size(); ++g)
      groups[g].options().set_lr(scheduled[g]);
  }
}

std::string wrapper_name(const std::string& key) {
  return key.empty() ? "the model's wrapper" : key + "'s wrapper";
}

namespace {

// "a NetImpl (6 parameters, the first 'fc1.weight')": the wrapped module, as a message names it.
std::string describe_wrapped(const torch::nn::Module& module) {
  const auto params = module.named_parameters();
  std::string text = "a " + module.name() + " (" + std::to_string(params.size()) + " parameters";
  if (!params.is_empty()) text += ", the first '" + params.begin()->key() + "'";
  return text + ")";
}

}  // namespace

std::vector<SavedWrapper> wrappers_of(const SnapshotParts& parts, const std::string& who) {
  const std::vector<DistributedDataParallel*> live = DistributedDataParallel::live_wrappers();
  std::vector<SavedWrapper> found;
  std::unordered_set<const DistributedDataParallel*> held;
  std::unordered_set<const c10::TensorImpl*> saved_params;
  for (const auto& [name, module] : parts.modules) {
    for (const auto& p : module->parameters()) saved_params.insert(p.unsafeGetTensorImpl());
    // The part itself, then what is inside it (named_modules() with include_self needs a part
    // held by a shared_ptr; a part may be any module).
    std::vector<std::pair<std::string, const torch::nn::Module*>> modules{{name, module}};
    for (const auto& inside : module->named_modules("", /*include_self=*/false))
      modules.emplace_back((name.empty() ? "" : name + ".") + inside.key(), inside.value().get());
    for (const auto& [key, inside] : modules) {
      int wrappers = 0;
      for (DistributedDataParallel* ddp : live) {
        if (&ddp->module() != inside || !held.insert(ddp).second) continue;
        if (++wrappers > 1) {
          throw std::runtime_error(who + ": two DistributedDataParallel wrappers wrap " +
                                   (key.empty() ? "the model" : key) + ", " +
                                   describe_wrapped(ddp->module()) +
                                   ": a snapshot could not tell their states apart; keep one "
                                   "wrapper per module");
        }
        found.push_back({key, ddp});
      }
    }
  }
  for (const DistributedDataParallel* ddp : live) {
    if (held.count(ddp) || !ddp->comm_hook_has_state()) continue;
    bool holds_saved = false;
    for (const auto& p : ddp->module().parameters())
      holds_saved = holds_saved || saved_params.count(p.unsafeGetTensorImpl()) > 0;
    throw std::runtime_error(
        who + ": a DistributedDataParallel wraps " + describe_wrapped(ddp->module()) +
        (holds_saved ? ", which holds modules of this snapshot and more,"
                     : ", which this snapshot does not hold,") +
        " and its comm hook " + ddp->comm_hook_description() +
        " keeps state between steps: a resume would restart that state, silently. " +
        (holds_saved ? "Give the Checkpointer the wrapped module (DistributedDataParallel::"
                       "module()) or the wrapper"
                     : "Save that module too (one Checkpointer of SnapshotParts for every "
                       "model, named), or register a stateless hook on its wrapper"));
  }
  return found;
}

GatheredStates gather_ddp_states(Communicator& comm, const DistributedDataParallel& ddp) {
  torch::serialize::OutputArchive archive;
  ddp.save_state(archive);
  std::ostringstream out;
  archive.save_to(out);
  const std::string mine = out.str();
  // Lengths first, so every row can be padded to the longest for one all_gather.
  GatheredStates gathered;
  gathered.lengths =
      comm.all_gather(torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong))
          .reshape({-1});
  const int64_t longest = gathered.lengths.max().item<int64_t>();
  torch::Tensor row = torch::zeros({longest}, torch::kByte);
  std::memcpy(row.data_ptr(), mine.data(), mine.size());
  gathered.bytes = comm.all_gather(row).reshape({comm.size(), longest});
  return gathered;
}

bool well_formed(const GatheredStates& states, int ranks) {
  const torch::Tensor& bytes = states.bytes;
  const torch::Tensor& lengths = states.lengths;
  return bytes.defined() && lengths.defined() && bytes.scalar_type() == torch::kByte &&
         bytes.dim() == 2 && bytes.size(0) == ranks && lengths.scalar_type() == torch::kLong &&
         lengths.dim() == 1 && lengths.numel() == ranks && lengths.min().item<int64_t>() >= 0 &&
         lengths.max().item<int64_t>() <= bytes.size(1);
}

std::string saved_stateful_hook(const GatheredStates& states) {
  const torch::Tensor bytes = states.bytes[0].contiguous();
  torch::serialize::InputArchive archive, hook;
  archive.load_from(static_cast<const char*>(bytes.data_ptr()),
                    static_cast<size_t>(states.lengths[0].item<int64_t>()));
  c10::IValue description;
  if (!archive.try_read("comm_hook", description) || !description.isString() ||
      !archive.try_read("comm_hook_state", hook)) {
    return "";
  }
  return description.toStringRef();
}

void write_wrapper_states(torch::serialize::OutputArchive& archive, const KeyedStates& states) {
  std::string keys;
  for (size_t i = 0; i < states.size(); ++i) {
    keys += states[i].first + "\n";
    torch::serialize::OutputArchive rows;
    rows.write("bytes", states[i].second.bytes);
    rows.write("lengths", states[i].second.lengths);
    archive.write(i == 0 ? "ddp_states" : "ddp_states_" + std::to_string(i), rows);
  }
  archive.write("ddp_wrappers", c10::IValue(keys));
}

KeyedStates read_wrapper_states(torch::serialize::InputArchive& archive) {
  std::vector<std::string> keys;
  c10::IValue listed;
  torch::serialize::InputArchive first;
  if (archive.try_read("ddp_wrappers", listed)) {
    if (!listed.isString()) throw std::runtime_error("ddp_wrappers is not a string");
    std::istringstream lines(listed.toStringRef());
    for (std::string line; std::getline(lines, line);) keys.push_back(line);
  } else if (archive.try_read("ddp_states", first)) {
    keys.push_back("");  // an older file: the one model's wrapper
  }
  KeyedStates states;
  for (size_t i = 0; i < keys.size(); ++i) {
    torch::serialize::InputArchive rows;
    archive.read(i == 0 ? "ddp_states" : "ddp_states_" + std::to_string(i), rows);
    GatheredStates gathered;
    rows.read("bytes", gathered.bytes);
    rows.read("lengths", gathered.lengths);
    states.emplace_back(keys[i], std::move(gathered));
  }
  return states;
}

std::vector<std::string> restore_wrappers(const std::vector<SavedWrapper>& live,
                                          const KeyedStates& saved, int saved_ranks, int rank,
                                          int ranks) {
  std::vector<std::string> not_restored;
  for (const SavedWrapper& wrapper : live) {
    const auto found = std::find_if(saved.begin(), saved.end(),
                                    [&](const auto& entry) { return entry.first == wrapper.key; });
    if (found != saved.end()) {
      const std::string why =
          restore_ddp_state(*wrapper.ddp, found->second, saved_ranks, rank, ranks);
      if (!why.empty()) not_restored.push_back(wrapper_name(wrapper.key) + ": " + why);
    } else if (wrapper.ddp->comm_hook_has_state()) {
      not_restored.push_back(wrapper_name(wrapper.key) + ": the comm hook " +
                             wrapper.ddp->comm_hook_description() +
                             " starts with a fresh state: the snapshot holds no state of this "
                             "wrapper (written by an older ddp, or by a run without it)");
    }
  }
  for (const auto& [key, states] : saved) {
    const bool taken =
        std::any_of(live.begin(), live.end(), [&](const SavedWrapper& w) { return w.key == key; });
    const std::string hook = taken ? "" : saved_stateful_hook(states);
    if (!hook.empty()) {
      not_restored.push_back(wrapper_name(key) +
                             ": the snapshot holds the state of its comm hook " + hook +
                             ", but this run has no wrapper of " +
                             (key.empty() ? "the model" : key) + ": not restored");
    }
  }
  return not_restored;
}

std::string restore_ddp_state(DistributedDataParallel& ddp, const GatheredStates& saved,
                              int saved_ranks, int rank, int ranks) {
  const bool same_rank = saved_ranks == ranks;
  const int64_t row = same_rank ? rank : 0;
  const torch::Tensor bytes = saved.bytes[row].contiguous();
  const int64_t length = saved.lengths[row].item<int64_t>();
  torch::serialize::InputArchive archive;
  archive.load_from(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(length));
  return ddp.load_state(archive, same_rank);
}

std::string encode_settings(const Settings& settings) {
  std::string text;
  for (const auto& [name, value] : settings)
    text += flattened(name) + "\t" + flattened(value) + "\n";
  return text;
}

Settings decode_settings(const std::string& text) {
  Settings settings;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    settings.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return settings;
}

}  // namespace ddp::detail

void ddp::check_snapshot_parts(const SnapshotParts& parts, const std::string& who) {
  const bool one = detail::one_model(parts);
  detail::check_names(parts.modules, "module", who, one);
  detail::check_names(parts.optimizers, "optimizer", who, one);
}

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

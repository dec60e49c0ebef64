#include "train/snapshot_state.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

namespace ddp::detail {

namespace {

std::string flattened(std::string text) {
  std::replace(text.begin(), text.end(), '\t', ' ');
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

GatheredStates gather_ddp_states(Communicator& comm, const DistributedDataParallel& ddp) {
  torch::serialize::OutputArchive archive;
  ddp.save_state(archive);
  std::ostringstream out;
  archive.save_to(out);
  const std::string mine = out.str();
  // Lengths first, so every row can be padded to the longest for one all_gather.
  GatheredStates gathered;
  gathered.lengths =
      comm.all_gather(torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong)).reshape({-1});
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
  for (const auto& [name, value] : settings) text += flattened(name) + "\t" + flattened(value) + "\n";
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
